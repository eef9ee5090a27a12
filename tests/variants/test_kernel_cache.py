"""The kernels' build cache (variants/kernels/_cache.py, and _build.py / kernels.prepare above it), driven
through the real compiler with small C++ libraries of the tests' own (gemv_avx512.cpp needs AVX-512):
a build keyed by what makes it differ, so two installs never rebuild over each other; a build killed
mid-compile (kill -9) rebuilt at once by the next process, which says so; a wait for a live build
bounded and saying what it waits for; a failed build not retried by every worker; VARIANTLAB_KERNELS=0."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from variantlab.variants import kernels
from variantlab.variants.kernels import _build, _cache

from conftest import TINY_KERNEL_SOURCE

REAL_REQUIREMENT = _build.missing_requirement   # (the tiny_kernels fixture replaces it)

# One process of an "install": builds or loads `name` from `root` with torch found at TORCH_DIR (what
# differs between two venvs), then prints what it did and what the library's function returns.
BUILDER = r"""
import ctypes, dataclasses, json, sys
from pathlib import Path
from variantlab.variants.kernels import _cache
root, name, source, cflags, torch_dir, wait_s = sys.argv[1:7]
toolchain = _cache.Toolchain.here()
if torch_dir:
    toolchain = dataclasses.replace(toolchain, torch_dir=torch_dir)
ext = _cache.Extension(name, (Path(source),), tuple(json.loads(cflags)))
got = _cache.build_or_load(ext, Path(root), toolchain=toolchain, wait_s=float(wait_s), say_every_s=1)
answer = ctypes.CDLL(str(got.library)).variantlab_test_answer()
print(json.dumps({"action": got.action, "library": str(got.library), "waited_s": got.waited_s,
                  "interrupted": list(got.interrupted), "answer": answer, "mtime": got.library.stat().st_mtime_ns}))
"""


def builder(root: Path, name: str, source: Path, cflags=("-O2", "-DANSWER=42"), torch_dir: str = "",
            wait_s: float = 60, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(root), name, str(source), json.dumps(list(cflags)),
                             torch_dir, str(wait_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finished(proc: subprocess.Popen, timeout: float = 180) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def slow_source(path: Path, functions: int = 25) -> Path:
    """A C++ file that takes the compiler seconds (deep template recursion, std containers, at -O2)."""
    parts = ["#include <algorithm>\n#include <map>\n#include <sstream>\n#include <string>\n#include <vector>"]
    for i in range(functions):
        parts.append(f"""
template <int K> struct S{i} {{ static long f(long x) {{ return S{i}<K - 1>::f(x * 3 + K) ^ (x >> 1); }} }};
template <> struct S{i}<0> {{ static long f(long x) {{ return x; }} }};
long g{i}(long x) {{
  std::map<std::string, std::vector<long>> m; std::ostringstream o; o << x; m[o.str()].push_back(S{i}<200>::f(x));
  std::vector<long> v(m.begin()->second); std::sort(v.begin(), v.end()); return v.empty() ? 0 : v[0];
}}""")
    parts.append(TINY_KERNEL_SOURCE)
    path.write_text("\n".join(parts))
    return path


def children(pid: int) -> list[str]:
    """The command names of a process's children (Linux /proc)."""
    names = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            for child in (task / "children").read_text().split():
                names.append(Path(f"/proc/{child}/comm").read_text().strip())
        except OSError:
            continue
    return names


@pytest.fixture
def tiny(tmp_path) -> _cache.Extension:
    source = tmp_path / "answer.cpp"
    source.write_text(TINY_KERNEL_SOURCE)
    return _cache.Extension("vl_tiny", (source,), ("-O2", "-DANSWER=42"))


# ---------------------------------------------------------------- the key

def test_the_build_folder_is_keyed_by_sources_flags_torch_python_and_compiler(tiny, tmp_path):
    here = _cache.Toolchain.here()
    key = _cache.build_key(tiny, here)
    assert _cache.build_key(tiny, here) == key          # the same build: the same folder, found again
    other_install = dataclasses.replace(here, torch_dir="/other/venv/lib/python3.11/site-packages/torch")
    differs = [dataclasses.replace(tiny, cflags=("-O3", "-DANSWER=42")), dataclasses.replace(tiny, ldflags=("-lm",))]
    keys = {_cache.build_key(e, here) for e in differs}
    keys |= {_cache.build_key(tiny, dataclasses.replace(here, **{f: "x"}))
             for f in ("torch_version", "torch_dir", "python", "compiler")}
    keys.add(_cache.build_key(tiny, other_install))
    assert key not in keys and len(keys) == 7
    assert _cache.build_folder(tiny, tmp_path, here).name == f"vl_tiny-{key[:16]}"
    Path(tiny.sources[0]).write_text(TINY_KERNEL_SOURCE + "// edited\n")
    assert _cache.build_key(tiny, here) != key


def test_the_cache_is_variantlabs_own_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path))
    assert _cache.default_root() == tmp_path / "kernels"
    monkeypatch.delenv("VARIANTLAB_CACHE")
    assert _cache.default_root() == Path.home() / ".cache" / "variantlab" / "kernels"


# ---------------------------------------------------------------- builds

def test_a_build_is_published_whole_then_loaded_without_lock_or_compiler(tiny, tmp_path):
    said = []
    got = _cache.build_or_load(tiny, tmp_path, say=said.append)
    assert got.action == "built" and got.built_here and got.library.is_file()
    assert said == [f"building vl_tiny once in {got.library.parent}"]
    assert sorted(p.name for p in got.library.parent.iterdir()) == ["build.lock", "vl_tiny.so"]  # no attempt left
    assert ctypes.CDLL(str(got.library)).variantlab_test_answer() == 42
    again = _cache.build_or_load(tiny, tmp_path, say=said.append)
    assert again.action == "loaded" and not again.built_here and again.library == got.library and len(said) == 1


def test_two_installs_side_by_side_each_load_their_own_build_without_rebuilding_the_other(tiny, tmp_path):
    """Two venvs (torch at two places) used to share ~/.cache/torch_extensions/py311_cpu/<name> and rebuild
    it over each other every time the other ran. Now each has its folder: built once each, side by side,
    then loaded by each without a rebuild (the libraries untouched)."""
    source = tiny.sources[0]
    installs = {"a": str(tmp_path / "venv-a" / "torch"), "b": str(tmp_path / "venv-b" / "torch")}
    first = {k: builder(tmp_path / "cache", "vl_two", source, torch_dir=d) for k, d in installs.items()}
    built = {k: finished(p)[0] for k, p in first.items()}
    assert [b["action"] for b in built.values()] == ["built", "built"]
    assert built["a"]["library"] != built["b"]["library"]
    again = {k: builder(tmp_path / "cache", "vl_two", source, torch_dir=d) for k, d in installs.items()}
    loaded = {k: finished(p) for k, p in again.items()}
    for k, (out, err) in loaded.items():
        assert out["action"] == "loaded" and out["answer"] == 42 and err == ""
        assert (out["library"], out["mtime"]) == (built[k]["library"], built[k]["mtime"])
    assert len(list((tmp_path / "cache").glob("vl_two-*"))) == 2


def test_a_build_killed_mid_compile_is_rebuilt_at_once_by_the_next_process_which_says_so(tmp_path):
    """kill -9 of a process while its compiler runs: torch's own `lock` file stayed and every later process
    waited on it forever. Now the dead holder's lock is free at once: the next process waits for nothing,
    removes the dead build's attempt, rebuilds and says so; the one after loads."""
    source = slow_source(tmp_path / "slow.cpp")
    root = tmp_path / "cache"
    victim = builder(root, "vl_slow", source, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "ninja" not in children(victim.pid):    # the compiler is running
            assert victim.poll() is None and time.monotonic() < deadline, victim.stderr.read() if victim.stderr else ""
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(30)
        folder = next(root.glob("vl_slow-*"))
        assert not (folder / "vl_slow.so").exists()                       # killed before its build was done
        assert [p.name for p in folder.glob("attempt-*")] == [f"attempt-{victim.pid}"]
        assert (folder / "build.lock").read_text().startswith(f"pid {victim.pid} since")
        out, err = finished(builder(root, "vl_slow", source, wait_s=600))
        assert out["action"] == "rebuilt" and out["waited_s"] == 0.0     # not a moment spent on the dead holder
        assert out["interrupted"] == [f"pid {victim.pid}"] and out["answer"] == 42
        assert f"the previous build (pid {victim.pid}) was interrupted" in err
        assert not list(folder.glob("attempt-*"))
        out, err = finished(builder(root, "vl_slow", source))
        assert out["action"] == "loaded" and err == ""
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)     # the compiler the killed build left running


def test_a_wait_for_a_live_build_is_bounded_and_says_what_it_waits_for(tiny, tmp_path):
    folder = _cache.build_folder(tiny, tmp_path)
    folder.mkdir(parents=True)
    said = []
    with _cache.build_lock(folder, "a holder", 1, said.append):     # a live build: this process holds the lock
        with pytest.raises(_cache.WaitedTooLong, match=f"pid {os.getpid()} since .* is building it in {folder}, "
                                                       "still after 1 s of waiting"):
            _cache.build_or_load(tiny, tmp_path, wait_s=1.0, say=said.append, say_every_s=0.3, poll_s=0.02)
    assert len(said) >= 3     # at once, then every 0.3 s
    assert all(s.startswith(f"waiting for vl_tiny: pid {os.getpid()} since ") and str(folder) in s
               and "giving up after 1 s" in s for s in said)
    assert not (folder / "vl_tiny.so").exists()


def test_a_wait_ends_when_the_live_build_does(tiny, tmp_path):
    folder = _cache.build_folder(tiny, tmp_path)
    folder.mkdir(parents=True)
    held, said = threading.Event(), []

    def holder():
        with _cache.build_lock(folder, "holder", 1, said.append):
            held.set()
            time.sleep(0.5)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    got = _cache.build_or_load(tiny, tmp_path, wait_s=60, say=said.append, poll_s=0.02)
    t.join()
    assert got.action == "built" and got.waited_s > 0 and said[0].startswith("waiting for vl_tiny")


def test_a_failed_build_is_kept_and_not_retried_by_a_caller_that_must_not_compile(tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text("int f( {")
    ext = _cache.Extension("vl_broken", (source,))
    with pytest.raises(RuntimeError, match="Error building extension"):
        _cache.build_or_load(ext, tmp_path, say=lambda s: None)
    folder = _cache.build_folder(ext, tmp_path)
    assert "Error building extension" in (folder / "failed.txt").read_text()
    assert not list(folder.glob("attempt-*"))      # a failure is not an interrupted build
    said = []
    with pytest.raises(_cache.FailedBefore, match=r"Error building extension .*\(an earlier build, kept in "):
        _cache.build_or_load(ext, tmp_path, say=said.append, retry_failed=False)
    assert said == []                              # no compiler ran


# ---------------------------------------------------------------- the kernels above it

def test_prepare_builds_our_kernels_once_and_says_so_then_they_only_load(tiny_kernels, tmp_path):
    said = []
    st = kernels.prepare(said.append)
    assert st.available and st.action == "built" and st.built_here
    folder = Path(st.library).parent
    assert folder.parent == tmp_path / "cache" / "kernels" and folder.name.startswith(tiny_kernels.name + "-")
    assert said[0] == f"building variantlab's CPU kernels once (about 35 s) in {folder}"
    assert said[1].startswith("built variantlab's CPU kernels in ") and said[1].endswith(
        f"s; workers load them from {st.library}")
    assert kernels.prepare(said.append) is st and len(said) == 2       # once per process
    kernels._status = None                                            # (a fresh process)
    st = kernels.prepare(said.append)
    assert st.available and st.action == "loaded" and not st.built_here and len(said) == 2


def test_prepare_says_it_rebuilt_after_an_interrupted_build(tiny_kernels):
    folder = _cache.build_folder(tiny_kernels)
    (folder / "attempt-999999").mkdir(parents=True)   # what a build killed mid-compile leaves
    said = []
    st = kernels.prepare(said.append)
    assert st.action == "rebuilt" and st.interrupted == ("pid 999999",)
    assert said[0].startswith("rebuilding variantlab's CPU kernels (about 35 s) in ")
    assert said[0].endswith(": the previous build (pid 999999) was interrupted")
    assert said[1].startswith("rebuilt variantlab's CPU kernels (the build of pid 999999 was interrupted) in ")


def test_prepare_does_nothing_for_a_gpu_run(tiny_kernels, monkeypatch):
    assert kernels.prepare(print, "cuda:0") is None and kernels._status is None


def test_a_wait_that_gives_up_leaves_aten_running_and_says_why(tiny_kernels, monkeypatch):
    monkeypatch.setattr(_build, "WAIT_S", 0.5)
    folder = _cache.build_folder(tiny_kernels)
    folder.mkdir(parents=True)
    said = []
    with _cache.build_lock(folder, "holder", 1, said.append):
        st = kernels.prepare(said.append)
    assert not st.available and st.waited_s >= 0.5 and st.built_here
    assert st.reason.startswith(f"our CPU kernels are off in this process: pid {os.getpid()} since ")
    assert st.reason.endswith(f"is building it in {folder}, still after 0.5 s of waiting; aten runs instead")
    assert said[0].startswith("waiting for variantlab's CPU kernels: ") and said[-1] == st.reason


def test_variantlab_kernels_0_still_switches_them_off_before_any_build(tiny_kernels, monkeypatch, tmp_path):
    monkeypatch.setattr(_build, "missing_requirement", REAL_REQUIREMENT)   # the switch is its first check
    monkeypatch.setenv(_build.SWITCH, "0")
    said = []
    st = kernels.prepare(said.append)
    assert not st.available and st.reason == "our CPU kernels are off: switched off (VARIANTLAB_KERNELS=0); " \
                                             "aten runs instead"
    assert said == [] and not (tmp_path / "cache").exists()       # nothing compiled, nothing written



@pytest.mark.slow
@pytest.mark.parametrize("isa", _build.ISAS, ids=lambda isa: isa.name)
def test_the_source_of_an_instruction_set_this_cpu_lacks_compiles_and_links_here(isa, tmp_path):
    """A host builds only its own instruction set's kernels (`_build.ISA`), so an edit could break the other's
    source unseen until a CPU that needs it runs. Here that source, with the step and the ops, is compiled with
    its own flags and linked with every symbol resolved (-Wl,--no-undefined); never loaded: its instructions
    need not run on this CPU. At -O0, not the build's -O3: what is checked is that it compiles and links, and
    the three files took 49 s at -O3, 26 s at -O0 on a 2-core AVX-512 EPYC (both instruction sets compile at
    -O0, immediates included)."""
    import shutil
    import sysconfig

    import torch
    from torch.utils import cpp_extension
    if isa is _build.ISA:
        pytest.skip(f"{isa.name} is this CPU's: built and run by tests/variants/test_kernels.py")
    cxx = os.environ.get("CXX") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    ext = isa.extension()
    includes = [f for p in (*cpp_extension.include_paths(), sysconfig.get_paths()["include"]) for f in ("-isystem", p)]
    flags = ["-std=c++17", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             f"-DTORCH_EXTENSION_NAME={ext.name}", *includes, *("-O0" if f.startswith("-O") else f for f in ext.cflags)]
    objects = []
    for source in ext.sources:
        objects.append(tmp_path / f"{source.stem}.o")
        done = subprocess.run([cxx, "-c", str(source), "-o", str(objects[-1]), *flags], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{source.name} does not compile for {isa.name}:\n{done.stderr[-4000:]}"
    torch_lib = Path(torch.__file__).parent / "lib"
    done = subprocess.run([cxx, "-shared", *map(str, objects), "-o", str(tmp_path / "kernels.so"), *ext.ldflags,
                           f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-Wl,--no-undefined"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{isa.name}'s kernels do not link:\n{done.stderr[-4000:]}"
