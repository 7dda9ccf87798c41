"""reference.device.scratch: the split-KV partial states' buffer both backends share
the code of (CPU tier; streams and graph capture: tests/test_split_scratch_gpu.py)."""

from __future__ import annotations

import weakref

import pytest
import torch

from reference import device as D

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _empty(monkeypatch):
    monkeypatch.setattr(D, "_SCRATCH", {})


def _span(t):
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


@pytest.mark.parametrize("shapes", [((3, 5, 7), (3, 5)), ((1,), (1,), (1,)), ((2, 4, 9, 1, 96), (2, 4, 9, 1)),
                                    ((70_000,), (33,))], ids=["odd", "ones", "split-like", "past-minimum"])
def test_views_have_the_shapes_asked_aligned_and_disjoint(shapes):
    views = D.scratch(CPU, shapes)
    (buf, memo), = D._SCRATCH.values()
    assert [tuple(t.shape) for t in views] == [tuple(s) for s in shapes]
    assert all(t.dtype == torch.float32 and t.is_contiguous() and t._base is buf for t in views)
    assert all((t.data_ptr() - buf.data_ptr()) % 256 == 0 for t in views)  # CUDA buffers start 512-aligned
    spans = sorted(_span(t) for t in views)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    lo, hi = _span(buf)
    assert all(lo <= a and b <= hi for a, b in spans)
    assert buf.numel() >= D.SCRATCH_MIN_NUMEL
    # every element writable without touching another view
    for i, t in enumerate(views):
        t.fill_(i)
    assert all(bool((t == i).all()) for i, t in enumerate(views))


def test_same_shapes_same_views_and_growth_drops_the_old_buffer():
    small = ((4, 8), (4,))
    a = D.scratch(CPU, small)
    assert D.scratch(CPU, small) is a  # memoised: nothing built on a repeat
    other = D.scratch(CPU, ((2, 3),))
    assert other[0]._base is a[0]._base  # one buffer per thread and stream, any number of shapes
    old = weakref.ref(a[0]._base)
    del a, other
    big = D.scratch(CPU, ((D.SCRATCH_MIN_NUMEL + 1,), (5,)))
    assert old() is None, "the outgrown buffer (and its memoised views) must be dropped"
    (buf, memo), = D._SCRATCH.values()
    assert big[0]._base is buf and list(memo) == [((D.SCRATCH_MIN_NUMEL + 1,), (5,))]
    again = D.scratch(CPU, small)  # re-cut from the grown buffer
    assert again[0]._base is buf and len(memo) == 2


def test_each_stream_key_gets_its_own_buffer(monkeypatch):
    key = ["s1"]
    monkeypatch.setattr(D, "_stream_key", lambda device, stream=None: key[0])
    shapes = ((16, 16), (16,))
    a = D.scratch(CPU, shapes)
    key[0] = "s2"
    b = D.scratch(CPU, shapes)
    assert a[0]._base is not b[0]._base
    spans = sorted([_span(a[0]._base), _span(b[0]._base)])
    assert spans[0][1] <= spans[1][0], "two streams' buffers overlap"
    key[0] = "s1"
    assert D.scratch(CPU, shapes) is a


def test_caches_are_bounded(monkeypatch):
    monkeypatch.setattr(D, "SCRATCH_KEYS_MAX", 3)
    monkeypatch.setattr(D, "SCRATCH_VIEWS_MAX", 4)
    key = [0]
    monkeypatch.setattr(D, "_stream_key", lambda device, stream=None: key[0])
    for i in range(4):
        key[0] = i
        D.scratch(CPU, ((8,),))
        assert len(D._SCRATCH) == (i % 3) + 1
    key[0] = 9
    for n in range(1, 10):
        D.scratch(CPU, ((n,),))
        (memo,) = [e[1] for k, e in D._SCRATCH.items() if k[1] == 9]
        assert 1 <= len(memo) <= 4


def test_clear_scratch():
    D.scratch(CPU, ((8,),))
    D.clear_scratch()
    assert D._SCRATCH == {}


def test_stream_key_of_cuda_streams(monkeypatch):
    """The CUDA branches of _stream_key with torch's stream and capture queries stood in:
    a device's default stream (handle 0 on every device) by its device, without a capture
    query (the legacy stream cannot capture); another stream by its handle, or no key while
    it captures; a device without an index is the current one."""
    stream, capturing, asked = [0], [True], []
    monkeypatch.setattr(D, "_raw_stream", lambda idx: asked.append(idx) or stream[0])
    monkeypatch.setattr(D, "_capturing", lambda: asked.append("capturing?") or capturing[0])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert D._stream_key(torch.device("cuda", 1)) == -2
    assert D._stream_key(torch.device("cuda", 0)) == -1
    assert D._stream_key(torch.device("cuda")) == -4
    assert asked == [1, 0, 3], "the default stream asked whether it captures"
    stream[0] = 0x7F00
    assert D._stream_key(torch.device("cuda", 1)) is None
    capturing[0] = False
    assert D._stream_key(torch.device("cuda", 1)) == 0x7F00
    assert D._stream_key(CPU) == "cpu"


def test_a_stream_handle_given_is_not_read_again(monkeypatch):
    """A caller that has read the current stream for its launches (Triton's split path)
    hands the raw handle over: it is the key, torch's stream query is not asked again,
    and a non-default handle still asks whether it captures."""
    asked = []
    monkeypatch.setattr(D, "_raw_stream", lambda idx: pytest.fail("the stream was read again"))
    monkeypatch.setattr(D, "_capturing", lambda: asked.append("capturing?") or False)
    assert D._stream_key(torch.device("cuda", 1), 0) == -2 and asked == []
    assert D._stream_key(torch.device("cuda", 1), 0x7F00) == 0x7F00 and asked == ["capturing?"]
    keys = []
    monkeypatch.setattr(D, "_stream_key", lambda device, stream=None: keys.append(stream) or ("k", stream))
    a = D.scratch(CPU, ((4,),), 0x7F00)
    assert keys == [0x7F00] and D.scratch(CPU, ((4,),)) is not a  # None: another key


def test_no_key_means_new_tensors_every_call(monkeypatch):
    """Under capture (_stream_key None) every call gets new tensors and nothing is cached."""
    monkeypatch.setattr(D, "_stream_key", lambda device, stream=None: None)
    shapes = ((4, 8), (4,))
    a, b = D.scratch(CPU, shapes), D.scratch(CPU, shapes)
    assert D._SCRATCH == {}
    assert [tuple(t.shape) for t in a] == [(4, 8), (4,)] and all(t.dtype == torch.float32 for t in a)
    assert all(x.data_ptr() != y.data_ptr() for x in a for y in b)


def test_each_thread_gets_its_own_buffer():
    """Two threads on one stream may interleave their launches: one buffer per thread."""
    import threading

    shapes = ((16,),)
    a = D.scratch(CPU, shapes)
    other = []
    t = threading.Thread(target=lambda: other.append(D.scratch(CPU, shapes)))
    t.start()
    t.join()
    assert other[0][0]._base is not a[0]._base and len(D._SCRATCH) == 2
    assert D.scratch(CPU, shapes) is a


def test_device_type_is_read_once_per_device(monkeypatch):
    """device_type answers torch.device.type, from a cache per device (the launchers ask
    it several times a call)."""
    monkeypatch.setattr(D, "_TYPES", {})
    for dev in (CPU, torch.device("cuda", 1), torch.device("cuda"), torch.device("meta")):
        assert D.device_type(dev) == dev.type and D.device_type(dev) is D._TYPES[dev]
    assert len(D._TYPES) == 4  # cuda:1 and cuda (no index) are two devices
    D._TYPES[CPU] = "cached"  # what is cached is answered, not read again
    assert D.device_type(CPU) == "cached"


def test_batch_slices_are_near_equal_and_cover_the_batch():
    """reference.device.batch_slices: the fewest slices of at most ``per`` batches, sizes
    differing by one at most, covering range(B) in order."""
    from reference.device import batch_slices
    for B in range(1, 40):
        for per in range(1, 12):
            cuts = batch_slices(B, per)
            sizes = [s.stop - s.start for s in cuts]
            assert len(cuts) == -(-B // per) and max(sizes) <= per and max(sizes) - min(sizes) <= 1
            assert cuts[0].start == 0 and cuts[-1].stop == B
            assert all(a.stop == b.start for a, b in zip(cuts, cuts[1:]))
