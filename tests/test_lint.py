"""pyflakes over every Python file of the repository: an undefined name in a path no CPU test
runs (a GPU script's branch) fails here instead of on the device. Session 40 found
``tools/gpu_tilelang.py`` calling ``subprocess`` without importing it since eba9a9c (its
D = 192 / 256 child). A finding on a line marked ``# noqa`` (two re-exports at session 40)
is left alone, whatever code the mark names."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("reference", "triton_impl", "tilelang_impl", "conformance", "tools", "tests")


def python_files() -> list[str]:
    """The tracked ``.py`` files (``git ls-files``), else every one at the top and under the
    packages (a checkout git will not read, e.g. one owned by another user)."""
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
        if out:
            return sorted(out)
    except (OSError, subprocess.SubprocessError):
        pass
    found = [f for f in os.listdir(ROOT) if f.endswith(".py")]
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files if f.endswith(".py")]
    return sorted(found)


def findings(path: str, source: str) -> list[str]:
    """pyflakes' messages for one file, those on ``# noqa`` lines left out."""
    from pyflakes import api, reporter as rep

    class Collect(rep.Reporter):
        def __init__(self):
            super().__init__(None, None)
            self.out = []

        def unexpectedError(self, filename, msg):
            self.out.append(f"{filename}: {msg}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.out.append(f"{filename}:{lineno}: {msg}")

        def flake(self, message):
            self.out.append((message.lineno, str(message)))

    r = Collect()
    api.check(source, path, r)
    lines = source.splitlines()
    return [m if isinstance(m, str) else m[1] for m in r.out
            if isinstance(m, str) or "# noqa" not in lines[m[0] - 1]]


def test_the_file_list_covers_the_packages():
    files = python_files()
    for pkg in PACKAGES:
        assert any(f.startswith(pkg + "/") for f in files), pkg


def test_pyflakes_finds_nothing():
    bad = []
    for f in python_files():
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            bad += findings(f, fh.read())
    assert not bad, "\n".join(bad)


def test_the_check_catches_an_undefined_name_and_honours_noqa():
    src = "import os\nimport json  # noqa: F401\n\ndef f():\n    return subprocess.run(os.sep)\n"
    out = findings("x.py", src)
    assert len(out) == 1 and "undefined name 'subprocess'" in out[0], out
