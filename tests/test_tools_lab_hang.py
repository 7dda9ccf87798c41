"""tools/lab_hang.py's watchdog on the CPU: fake children that finish, stall after their first
launch, stall before it, or fail (the GPU child runs on the device only)."""
import sys

import pytest

from tools import lab_hang


def _child(body):
    return [sys.executable, "-c", "import sys, time\n" + body]


def test_a_child_that_finishes_is_ok():
    r = lab_hang.watch(_child("print('ready'); print('launches 5'); print('launches 10')"),
                       "graph", 10, 5, 5.0, 5.0)
    assert (r["status"], r["launches_done"], r["tail"]) == ("ok", 10, [])


def test_a_child_that_stops_making_progress_is_killed_and_reported_hung():
    r = lab_hang.watch(_child("print('ready', flush=True); print('launches 5', flush=True); "
                              "time.sleep(60)"), "eager", 20, 5, 0.5, 5.0)
    assert (r["status"], r["launches_done"], r["hang_within"]) == ("hung", 5, 5)
    assert r["seconds"] < 30 and r["killed"] and r["tail"] == ["ready", "launches 5"]


def test_a_child_that_exits_while_a_grandchild_holds_its_output_is_not_called_hung():
    r = lab_hang.watch(_child("import subprocess\n"
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'])\n"
                              "print('ready'); print('launches 5', flush=True)"),
                       "eager", 5, 5, 0.5, 5.0)
    assert (r["status"], r["launches_done"]) == ("ok", 5), r


def test_a_child_that_never_launches_is_not_called_hung():
    r = lab_hang.watch(_child("time.sleep(60)"), "eager", 20, 5, 0.5, 0.5)
    assert (r["status"], r["launches_done"], r["hang_within"]) == (
        "stalled before the first launch", 0, None)


@pytest.mark.parametrize("body, status", [
    ("print('ready'); sys.exit(3)", "rc 3"),
    ("print('ready'); print('launches 5')", "stopped short"),
])
def test_a_child_that_fails_or_stops_short_is_reported_with_its_last_lines(body, status):
    r = lab_hang.watch(_child(body), "graph", 10, 5, 5.0, 5.0)
    assert r["status"] == status and r["tail"][0] == "ready"


@pytest.mark.parametrize("argv", [["--every", "0"], ["--launches", "5", "--every", "10"],
                                  ["--modes", "eager,replay"], ["--stall-s", "0"],
                                  ["--build-s", "-1"], ["--gdb-s", "0"],
                                  ["--variant", "no-such-variant"],
                                  ["--shape", "no such shape"]])
def test_bad_arguments_are_refused_before_any_child_starts(argv):
    with pytest.raises(SystemExit) as e:
        lab_hang.main(argv)
    assert e.value.code == 2


def test_the_grid_line_is_kept_in_the_report():
    r = lab_hang.watch(_child("print('programs 256 SMs 132 splits 1'); print('ready'); "
                              "print('launches 5')"), "eager", 5, 5, 5.0, 5.0)
    assert r["status"] == "ok" and r["grid"] == "programs 256 SMs 132 splits 1"


def test_dims_are_checked_and_passed_to_the_child():
    assert lab_hang.parse_dims("1,32,4,512,512,64") == (1, 32, 4, 512, 512, 64)
    for bad in ("1,32,4,512,512", "1,32,5,512,512,64", "1,32,4,1024,512,64", "0,32,4,8,8,64",
                "a,b,c,d,e,f"):
        with pytest.raises(ValueError, match="--dims"):
            lab_hang.parse_dims(bad)
    with pytest.raises(SystemExit):
        lab_hang.main(["--dims", "1,2,3"])

    class A:
        variant, shape, launches, every, dims = "occ3-64x64v", "x", 10, 5, "1,32,4,512,512,64"
    cmd = lab_hang.child_cmd(A, "graph")
    assert cmd[cmd.index("--dims") + 1] == "1,32,4,512,512,64" and "--child" in cmd
    A.dims = None
    assert "--dims" not in lab_hang.child_cmd(A, "graph")


def test_on_hang_sees_the_live_child_before_the_kill():
    import os
    seen = []

    def probe(pid):
        os.kill(pid, 0)  # alive: raises if it were gone
        seen.append(pid)
        return "warps: all waiting"
    r = lab_hang.watch(_child("print('ready', flush=True); time.sleep(60)"), "eager", 5, 5, 0.5,
                       5.0, on_hang=probe)
    assert r["status"] == "hung" and r["on_hang"] == "warps: all waiting" and len(seen) == 1
    # not called where the child never became ready, nor where it finished
    r = lab_hang.watch(_child("time.sleep(60)"), "eager", 5, 5, 0.5, 0.5, on_hang=probe)
    assert "on_hang" not in r and len(seen) == 1


def test_gdb_commands_list_the_warps_before_the_instructions(monkeypatch):
    cmds = lab_hang.gdb_commands(sms=2, warps=3)
    assert cmds[-1] == "detach" and cmds.count("info cuda warps") == 2
    assert cmds.index("info cuda warps") < cmds.index("cuda device 0 sm 0 warp 0 lane 0")
    assert len(lab_hang.gdb_commands()) == 3 + 2 * 2 + 2 * 64 * 3 + 1  # 64 warp slots an SM
    assert sum(c == "x/3i $pc" for c in cmds) == 6
    monkeypatch.setattr(lab_hang.shutil, "which", lambda name: None)
    assert "not on the PATH" in lab_hang.gdb_dump(12345)
    with pytest.raises(SystemExit) as e:
        lab_hang.main(["--gdb"])
    assert e.value.code == 2


def test_a_probe_that_fails_still_gets_the_child_killed():
    def probe(pid):
        raise RuntimeError("no debugger")
    r = lab_hang.watch(_child("print('ready', flush=True); time.sleep(60)"), "eager", 5, 5, 0.5,
                       5.0, on_hang=probe)
    assert r["status"] == "hung" and r["killed"] and "no debugger" in r["on_hang"]


def test_the_report_keeps_the_dump_from_its_first_warp_table():
    dump = "banner\n" * 500 + "  Wp Active Lanes Mask   Active PC\n*  0 0xffffffff 0x0d30\n"
    head = lab_hang.report_head(dump, 60)
    assert head.startswith(" Wp Active") and "0x0d30" in head
    assert lab_hang.report_head("no table here", 5) == "no ta"
