"""Runtime and cache robustness (issue 17): what a new user's process, cache and command line may throw at it.

| bar of the issue                         | test                                                             |
|------------------------------------------|------------------------------------------------------------------|
| forked child after use: right result,    | test_forked_child_after_use_gets_the_right_result (os.fork, 60 s)|
|   every DataLoader worker (fork)         | test_fork_dataloader_workers_run_the_op                          |
|   a fork's devices are its own           | test_devices_belong_to_the_process_that_made_them                |
|   spawn keeps working                    | test_spawned_child_runs_the_op                                   |
| cached artifact garbage, truncated, with | test_corrupted_artifact_is_rebuilt_on_the_next_run (CORRUPTIONS, |
|   no digest, or refused by IREE: rebuilt |   twice in a row)                                                |
|   changed after the lookup: never loaded | test_an_artifact_corrupted_after_the_cache_lookup_is_never_loaded|
|   no compiler: an error naming the file  | test_without_the_compiler_a_bad_artifact_is_named_not_loaded     |
| read-only cache with artifacts: used     | test_read_only_cache[prefilled]                                  |
| empty read-only cache: runs (fallback    | test_read_only_cache[empty]                                      |
|   named in a warning) or names           | test_no_writable_cache_names_the_variable                        |
|   NSA_IREE_CACHE_DIR                     | test_the_shared_tmp_fallback_must_be_private                     |
|                                          | test_the_compiler_gets_a_writable_temporary_directory            |
| transposed-view q, k: backward works,    | test_transposed_views_backward                                   |
|   outputs contiguous                     | test_bwd_outputs_are_contiguous_whatever_the_inputs_strides      |
| CPU workspaces kept between calls:       | test_reused_workspaces_give_each_call_its_own_result (sizes up,  |
|   each call still gets its own result    |   down and up again; four threads at once)                       |
| no "leaked" line at exit                 | test_no_leak_report_at_exit (the README example), and the forked |
|                                          |   child's exit in the first test                                 |
| CUDA: a thread with no current context   | test_a_thread_without_a_cuda_context_gets_the_primary_one (the   |
|   (autograd's) gets the primary one      |   driver faked; on the GPU: bench/thread_check.py)               |
| CLI: one-line errors for bad values      | test_cli_bad_values_are_one_line_errors (BAD_CLI_VALUES), ...    |
| CLI: bench writes under the cwd          | test_bench.py::test_bench_smoke_run_writes_table_and_record      |

Process-level behaviour (fork, exit, crashes, read-only mounts) runs in subprocesses with timeouts; their
shapes are test_api's, so their artifacts are small (a few seconds to compile on a CPU).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import nsa_iree
from nsa_iree import cache, cli
from nsa_iree.spec import target_cpu_from_environment
from nsa_iree.compiler import compile_artifact
from nsa_iree.demo import relative_rms_error
from nsa_iree.reference import selection_attention_reference
from nsa_iree.spec import KernelSpec

REPO = Path(__file__).resolve().parent.parent
B, M, N, H, G, D, DV, BS, T = 2, 40, 56, 4, 2, 16, 8, 8, 3
SPEC = KernelSpec(heads=H, kv_heads=G, head_dim=D, value_dim=DV, block_size=BS, num_blocks=T, dtype="f32",
                  target="cpu")

# Imported by every subprocess: the problem, and run() -> (o, dq, dk, dv) checked against the f64 reference.
PRELUDE = textwrap.dedent(f"""
    import os, sys, time, torch, nsa_iree
    from nsa_iree.demo import relative_rms_error
    from nsa_iree.reference import selection_attention_reference
    B, M, N, H, G, D, DV, BS, T = {B}, {M}, {N}, {H}, {G}, {D}, {DV}, {BS}, {T}
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, h, d, generator=gen) for n, h, d in ((M, H, D), (N, G, D), (N, G, DV)))
    idx = torch.randint(-1, N // BS, (B, M, G, T), generator=gen)
    do = torch.randn(B, M, H, DV, generator=gen)

    def run():
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        o = nsa_iree.selection_attention(*leaves, idx, block_size=BS)
        o.backward(do)
        return [o.detach()] + [t.grad for t in leaves]

    def reference():
        leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
        o, _ = selection_attention_reference(*leaves, idx, BS)
        o.backward(do.double())
        return [o.detach()] + [t.grad for t in leaves]

    REFERENCE = reference()

    def check(outs):
        errors = [relative_rms_error(x, r) for x, r in zip(outs, REFERENCE)]
        assert all(e < 1e-5 for e in errors), errors
""")


def _env(**extra) -> dict:
    env = {**os.environ, **{k: str(v) for k, v in extra.items()}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def run_script(body: str, tmp_path: Path, timeout=240, prefix=(), header="", **env) -> subprocess.CompletedProcess:
    """Run header + PRELUDE + body in a fresh interpreter (its own session: a hung child is killed with it)."""
    script = tmp_path / f"script_{len(list(tmp_path.glob('script_*.py')))}.py"
    script.write_text(header + PRELUDE + textwrap.dedent(body))
    # The per-user fallback caches of this run, not the machine's: nothing there can stand in for what a test
    # broke in its own cache.
    env.setdefault("XDG_CACHE_HOME", tmp_path / "xdg")
    env.setdefault("TMPDIR", tmp_path / "tmp")
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    proc = subprocess.Popen([*prefix, sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(**env), cwd=tmp_path, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A directory holding the verified forward and two-pass artifacts of SPEC (copied into each test's cache)."""
    directory = tmp_path_factory.mktemp("built")
    spec = SPEC.replace(target_cpu=target_cpu_from_environment())   # what the children will look for
    for variant in ("forward", "two-pass"):
        compile_artifact(spec, variant, out_dir=directory)
    return directory


def cache_from(built: Path, target: Path) -> Path:
    shutil.copytree(built, target)
    return target


# --- fork safety ----------------------------------------------------------------------------------------

def test_forked_child_after_use_gets_the_right_result(tmp_path, built):
    """The parent runs the op, forks; the child's first call (forward and backward) returns the right result
    within 60 s and exits normally (sys.exit: the interpreter's teardown runs and never touches the parent's
    IREE objects)."""
    result = run_script("""
        check(run())
        torch.randn(512, 512).sum(0)                          # torch's thread pool has run in the parent
        # Large enough that the copies inside the call (int64 indices, a transposed q) are parallel torch ops.
        Mb = 4096
        qb, kb, vb = (torch.randn(1, Mb, h, d).transpose(1, 2).contiguous().transpose(1, 2)
                      for h, d in ((H, D), (G, D), (G, DV)))
        idxb = torch.randint(-1, Mb // BS, (1, Mb, G, T))
        ob, _ = nsa_iree.selection_attention_fwd(qb, kb, vb, idxb, BS)
        pid = os.fork()
        if pid == 0:
            start = time.monotonic()
            assert torch.equal(nsa_iree.selection_attention_fwd(qb, kb, vb, idxb, BS)[0], ob)
            check(run())
            print(f"child ok in {time.monotonic() - start:.1f} s", flush=True)
            sys.exit(0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                sys.exit(os.waitstatus_to_exitcode(status))
            time.sleep(0.1)
        os.kill(pid, 9)
        sys.exit("the forked child did not finish within 60 s")
    """, tmp_path, NSA_IREE_CACHE_DIR=cache_from(built, tmp_path / "cache"))
    assert_ok(result)
    assert "child ok" in result.stdout
    assert "leaked" not in result.stderr


def test_fork_dataloader_workers_run_the_op(tmp_path, built):
    """torch DataLoader workers (fork context, the Linux default) call the op after the parent did."""
    result = run_script("""
        class Problems(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return torch.stack([x.reshape(-1)[:64] for x in run()])

        expected = torch.stack([x.reshape(-1)[:64] for x in run()])
        loader = torch.utils.data.DataLoader(Problems(), batch_size=None, num_workers=2,
                                             multiprocessing_context="fork", timeout=60)
        outs = list(loader)
        assert len(outs) == 4 and all(torch.equal(x, expected) for x in outs)
        print("workers ok")
    """, tmp_path, NSA_IREE_CACHE_DIR=cache_from(built, tmp_path / "cache"))
    assert_ok(result)
    assert "workers ok" in result.stdout


def test_spawned_child_runs_the_op(tmp_path, built):
    result = run_script("""
        import multiprocessing

        def child_run(_):
            check(run())
            return True

        if __name__ == "__main__":
            check(run())
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                assert pool.map(child_run, [0]) == [True]
            print("spawn ok")
    """, tmp_path, NSA_IREE_CACHE_DIR=cache_from(built, tmp_path / "cache"))
    assert_ok(result)
    assert "spawn ok" in result.stdout


def test_devices_belong_to_the_process_that_made_them():
    """In-process view of the same rule: a fork gives the child no device of its parent's."""
    from nsa_iree import runtime

    parent = runtime.device_for(torch.device("cpu"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                             # no IREE call here: only the bookkeeping
        try:
            same = runtime._devices.get(torch.device("cpu")) is parent
            os.write(write, b"same" if same else b"fresh")
        finally:
            os._exit(0)                                      # never back into pytest
    os.close(write)
    answer = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"fresh"
    assert runtime.device_for(torch.device("cpu")) is parent


class _FakeDriver:
    """libcuda's calls that runtime._cuda_context_current makes, recorded; `current` the thread's context."""

    def __init__(self, current):
        self.current, self.calls = current, []

    def __getattr__(self, name):
        import ctypes

        def call(*args):
            self.calls.append(name)
            if name == "cuCtxGetCurrent":
                ctypes.cast(args[0], ctypes.POINTER(ctypes.c_void_p))[0] = self.current
            if name == "cuDeviceGet":
                ctypes.cast(args[0], ctypes.POINTER(ctypes.c_int))[0] = 10 + args[1]
            if name == "cuDevicePrimaryCtxRetain":
                assert args[1].value == 13                   # the device of index 3
                ctypes.cast(args[0], ctypes.POINTER(ctypes.c_void_p))[0] = 0xC0
            if name == "cuCtxSetCurrent":
                self.current = args[0].value
            return 0
        return call


@pytest.mark.parametrize("current, calls, after", [
    (None, ["cuCtxGetCurrent", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
            "cuDevicePrimaryCtxRelease"], 0xC0),
    (0xAB, ["cuCtxGetCurrent"], 0xAB),                          # a context current already: left as it is
], ids=["no_context", "context_current"])
def test_a_thread_without_a_cuda_context_gets_the_primary_one(monkeypatch, current, calls, after):
    from nsa_iree import runtime

    fake = _FakeDriver(current)
    monkeypatch.setattr(runtime, "_libcuda", lambda: fake)
    runtime._cuda_context_current(3)
    assert (fake.calls, fake.current) == (calls, after)


class _PolicyRecorder:
    """A module's VmContext, recording the calling thread's scheduling policy as each call runs."""

    def __init__(self, context):
        self.context, self.policies = context, []

    def invoke(self, *args):
        self.policies.append(os.sched_getscheduler(0))
        return self.context.invoke(*args)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
@pytest.mark.parametrize("own", ["SCHED_OTHER", "SCHED_BATCH"])
def test_a_cpu_call_waits_as_sched_batch_and_gives_the_thread_its_policy_back(own):
    """A CPU call's thread waits for IREE's workers as SCHED_BATCH (runtime._no_wakeup_preemption), and has its own
    policy back after; a thread the application made SCHED_BATCH (any but SCHED_OTHER) is left as it is."""
    from nsa_iree import runtime

    q, k, v, idx, _ = _problem(seed=2)
    expected = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    modules = list(runtime.device_for(torch.device("cpu"))._modules.values())
    recorders = [_PolicyRecorder(module.context) for module in modules]
    policy = getattr(os, own)
    try:
        for module, recorder in zip(modules, recorders):
            module.context = recorder
        os.sched_setscheduler(0, policy, os.sched_param(0))
        got = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
        assert os.sched_getscheduler(0) == policy
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        for module, recorder in zip(modules, recorders):
            module.context = recorder.context
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert {p for r in recorders for p in r.policies} == {os.SCHED_BATCH}


# --- artifacts verified before loading --------------------------------------------------------------------

def _garbage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    data[start:start + 4096] = bytes((i * 131 + 7) % 256 for i in range(4096))   # 4 KB of junk inside
    path.write_bytes(bytes(data))


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _no_digest(path: Path) -> None:
    cache.digest_path(path).unlink()                          # as written before digests existed


def _refused_by_iree(path: Path) -> None:
    _truncated(path)                                          # a digest that matches a file IREE cannot load
    cache.write_artifact(path, path.read_bytes())


CORRUPTIONS = {"garbage": _garbage, "truncated": _truncated, "no digest": _no_digest,
               "refused by IREE": _refused_by_iree}


@pytest.mark.parametrize("corruption", CORRUPTIONS, ids=list(CORRUPTIONS))
def test_corrupted_artifact_is_rebuilt_on_the_next_run(tmp_path, built, corruption):
    """Every cached artifact is corrupted, then a new process runs forward and backward: it warns, compiles
    again, and gets the right result. Twice in a row: the rebuilt cache is sound again."""
    directory = cache_from(built, tmp_path / "cache")
    for attempt in range(2):
        for vmfb in directory.glob("*.vmfb"):
            CORRUPTIONS[corruption](vmfb)
        result = run_script("check(run()); print('ok')", tmp_path, NSA_IREE_CACHE_DIR=directory)
        assert_ok(result)
        assert "compiling it again" in result.stderr, result.stderr
        assert all(cache.problem_with(p) is None for p in directory.glob("*.vmfb")), attempt


def test_an_artifact_corrupted_after_the_cache_lookup_is_never_loaded(tmp_path, monkeypatch, built):
    """The loader checks the bytes it loads, not only the lookup: a file changed between the two is compiled
    again (in-process: api's path cache still names it)."""
    from nsa_iree import api, runtime

    directory = cache_from(built, tmp_path / "cache")
    monkeypatch.setenv("NSA_IREE_CACHE_DIR", str(directory))
    api._artifact_path.cache_clear()
    device = runtime.Device(torch.device("cpu"))               # a device of its own: nothing loaded yet
    try:
        path = api._artifact_path(SPEC, "forward")
        _garbage(path)
        with pytest.raises(cache.ArtifactError, match="does not match its digest"):
            device.module(path)
        with pytest.warns(RuntimeWarning, match="compiling it again"):
            module = device.module(path, rebuild=lambda: compile_artifact(SPEC, "forward", rebuild=True).path)
        assert module.vm_module is not None and cache.problem_with(path) is None
    finally:
        device.close()
        api._artifact_path.cache_clear()


NO_COMPILER = "import sys; sys.modules['iree.compiler'] = None   # a GPU box: the runtime only\n"


def test_without_the_compiler_a_bad_artifact_is_named_not_loaded(tmp_path, built):
    """With only the runtime, verified artifacts are used; a corrupted one is refused with an error naming
    the file and NSA_IREE_CACHE_DIR, never loaded (4 KB of garbage in a vmfb can SIGILL the process)."""
    directory = cache_from(built, tmp_path / "cache")
    good = run_script("check(run()); print('ok')", tmp_path, header=NO_COMPILER, NSA_IREE_CACHE_DIR=directory)
    assert_ok(good)
    (vmfb,) = directory.glob("forward_*.vmfb")
    _garbage(vmfb)
    bad = run_script("""
        try:
            run()
        except nsa_iree.cache.ArtifactError as err:
            print(err)
            sys.exit(3)
    """, tmp_path, header=NO_COMPILER, NSA_IREE_CACHE_DIR=directory)
    assert bad.returncode == 3, (bad.returncode, bad.stdout, bad.stderr[-3000:])
    assert str(vmfb) in bad.stdout and "NSA_IREE_CACHE_DIR" in bad.stdout and "digest" in bad.stdout


# --- read-only caches -------------------------------------------------------------------------------------

def _read_only_prefix(tmp_path: Path, directories) -> tuple:
    """A command prefix under which `directories` are read-only: a private read-only bind mount when running
    as root (root ignores file modes), else their modes (restored at teardown by the fixture below)."""
    if os.geteuid() != 0:
        for d in directories:
            for p in [d, *d.rglob("*")]:
                p.chmod(0o555 if p.is_dir() else 0o444)
        return ()
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("running as root without mount namespaces: cannot make a directory read-only")
    mounts = "; ".join(f"mount --bind -o ro '{d}' '{d}'" for d in directories)
    return ("unshare", "-m", "sh", "-c", f'set -e; {mounts}; exec "$@"', "sh")


@pytest.fixture
def restore_modes(tmp_path):
    yield
    for p in tmp_path.rglob("*"):
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)


READ_ONLY = {
    # cache contents -> what must happen
    "prefilled": "the verified artifacts are used as they are: nothing compiled, nothing written, no warning",
    "prefilled, runtime only": "the same on a machine without the compiler (artifacts compiled elsewhere)",
    "empty": "it runs, compiling into the per-user cache named in a warning; the next run finds them there",
}


@pytest.mark.parametrize("contents", READ_ONLY, ids=list(READ_ONLY))
def test_read_only_cache(tmp_path, built, restore_modes, contents):
    prefilled = contents.startswith("prefilled")
    directory = cache_from(built, tmp_path / "cache") if prefilled else tmp_path / "cache"
    directory.mkdir(exist_ok=True)
    home, tmp = tmp_path / "xdg", tmp_path / "tmp"
    prefix = _read_only_prefix(tmp_path, [directory])
    env = dict(NSA_IREE_CACHE_DIR=directory, XDG_CACHE_HOME=home, TMPDIR=tmp)
    header = NO_COMPILER if "runtime only" in contents else ""
    first = run_script("check(run()); print('ok')", tmp_path, prefix=prefix, header=header, **env)
    assert_ok(first)
    fallback = home / "nsa_iree"
    if prefilled:
        assert "cannot be written" not in first.stderr and not fallback.exists(), first.stderr
    else:
        assert f"goes to {fallback} instead" in first.stderr and "NSA_IREE_CACHE_DIR" in first.stderr
        built_here = {p: p.stat().st_mtime_ns for p in fallback.glob("*.vmfb")}
        assert len(built_here) == 2
        second = run_script("check(run()); print('ok')", tmp_path, prefix=prefix, **env)
        assert_ok(second)
        assert {p: p.stat().st_mtime_ns for p in fallback.glob("*.vmfb")} == built_here   # reused, not rebuilt
    assert not list(tmp.glob("nsa_iree*")) and sorted(p.name for p in directory.iterdir()) == sorted(
        p.name for p in (built.iterdir() if prefilled else ()))


def test_no_writable_cache_names_the_variable(tmp_path, restore_modes):
    """An empty read-only cache with no writable per-user directory either: one clear error, naming
    NSA_IREE_CACHE_DIR and the directories tried, before anything is compiled."""
    directory, other = tmp_path / "cache", tmp_path / "other"
    directory.mkdir()
    other.mkdir()
    prefix = _read_only_prefix(tmp_path, [directory, other])
    result = run_script(f"""
        from pathlib import Path
        import nsa_iree.cache
        nsa_iree.cache.fallback_dirs = lambda primary: [Path({str(other)!r})]
        try:
            run()
        except nsa_iree.cache.ArtifactError as err:
            print(err)
            sys.exit(3)
    """, tmp_path, prefix=prefix, NSA_IREE_CACHE_DIR=directory)
    assert result.returncode == 3, (result.stdout, result.stderr[-3000:])
    assert "NSA_IREE_CACHE_DIR" in result.stdout and str(directory) in result.stdout and str(other) in result.stdout


def test_the_shared_tmp_fallback_must_be_private(tmp_path, monkeypatch):
    """<tmp>/nsa_iree-<uid> made by someone else, or writable by others, is not used: artifacts are code."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    user_dir = cache._user_tmp_dir()
    assert cache.probe_writable(user_dir) is None and (user_dir.stat().st_mode & 0o777) == 0o700
    user_dir.chmod(0o777)
    assert isinstance(cache.probe_writable(user_dir), PermissionError)


def test_the_compiler_gets_a_writable_temporary_directory(tmp_path, monkeypatch):
    """iree-compile writes a temporary file in $TMPDIR (else /tmp): with that read-only, compiling into a
    writable fallback failed with "failed to generate temporary file"; the compile gets a writable one."""
    read_only, writable = str(tmp_path / "read_only"), tmp_path / "writable"
    writable.mkdir()
    monkeypatch.setenv("TMPDIR", read_only)
    monkeypatch.setattr(tempfile, "tempdir", None)
    real = cache._can_create_in
    monkeypatch.setattr(cache, "_can_create_in", lambda d: d != read_only and real(d))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: (_ for _ in ()).throw(FileNotFoundError("none")))
    with cache.tool_tmpdir(writable):
        assert os.environ["TMPDIR"] == str(writable)
    assert os.environ["TMPDIR"] == read_only
    monkeypatch.setenv("TMPDIR", str(writable))
    with cache.tool_tmpdir(tmp_path / "unused"):
        assert os.environ["TMPDIR"] == str(writable)                  # a writable one is left alone


# --- outputs contiguous whatever the inputs' strides ------------------------------------------------------

def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, M, H, D, generator=gen)
    k = torch.randn(B, N, G, D, generator=gen)
    v = torch.randn(B, N, G, DV, generator=gen)
    idx = torch.randint(-1, N // BS, (B, M, G, T), generator=gen)
    do = torch.randn(B, M, H, DV, generator=gen)
    return q, k, v, idx, do


@pytest.mark.parametrize("variant", ["two-pass", "one-pass"])
def test_transposed_views_backward(variant):
    """q, k, v as transposed views of [B, H, M, D] leaves (the usual layout): the backward works and matches
    the reference."""
    q, k, v, idx, do = _problem()
    leaves = [t.transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v)]   # [B, H, M, D]
    o = nsa_iree.selection_attention(*(t.transpose(1, 2) for t in leaves), idx, block_size=BS, variant=variant)
    assert o.is_contiguous()
    o.backward(do)
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = selection_attention_reference(*ref, idx, BS)
    o_ref.backward(do.double())
    assert relative_rms_error(o.detach(), o_ref.detach()) < 1e-5
    for name, ours, theirs in zip("qkv", leaves, ref):
        assert relative_rms_error(ours.grad.transpose(1, 2), theirs.grad) < 1e-5, name


def test_bwd_outputs_are_contiguous_whatever_the_inputs_strides():
    q, k, v, idx, do = _problem()
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    expected = nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, BS)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, o)]
    lse_view = lse.transpose(1, 2).contiguous().transpose(1, 2)
    do_view = do.transpose(1, 2).contiguous().transpose(1, 2)
    got = nsa_iree.selection_attention_bwd(*views, lse_view, do_view, idx, BS)
    for name, a, b in zip(("dq", "dk", "dv"), got, expected):
        assert a.is_contiguous() and torch.equal(a, b), name


def test_reused_workspaces_give_each_call_its_own_result():
    """A module keeps the workspaces of finished CPU calls for the next ones (nsa_iree.runtime): calls of a
    larger, a smaller and the larger size again, and four threads calling at once, each get the gradients that
    call alone gets."""
    import threading

    q, k, v, idx, do = _problem(seed=1)
    problems = {M: (q, k, v, idx, do), M // 2: (q[:, :M // 2], k, v, idx[:, :M // 2], do[:, :M // 2])}

    def gradients(seq):
        q, k, v, idx, do = problems[seq]
        o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
        return nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, BS)

    alone = {seq: gradients(seq) for seq in problems}
    for seq in (M, M // 2, M):
        assert all(torch.equal(a, b) for a, b in zip(gradients(seq), alone[seq])), seq
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, gradients((M, M // 2)[i % 2])))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3]
    for i, got in results.items():
        assert all(torch.equal(a, b) for a, b in zip(got, alone[(M, M // 2)[i % 2]])), i


@pytest.fixture
def fenced_cpu(tmp_path, monkeypatch):
    """The CPU recipe with IREE's asynchronous calling convention (the GPU recipes' execution_model), in a cache of
    its own: its modules take a wait and a signal fence, which Module.call passes and waits on."""
    from nsa_iree.recipes import PIPELINES_DIR

    recipes = tmp_path / "recipes"
    shutil.copytree(PIPELINES_DIR, recipes)
    text = (recipes / "cpu.toml").read_text()
    (recipes / "cpu.toml").write_text(text.replace('driver = "local-task"\n',
                                                   'driver = "local-task"\nexecution_model = "async-external"\n'))
    monkeypatch.setenv("NSA_IREE_PIPELINES_DIR", str(recipes))
    monkeypatch.setenv("NSA_IREE_CACHE_DIR", str(tmp_path / "cache"))


def _forward_and_backward(q, k, v, idx, do):
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    return (o, lse) + tuple(nsa_iree.selection_attention_bwd(q, k, v, o, lse, do, idx, BS))


def test_fenced_calls_return_done_with_the_synchronous_bits(request, monkeypatch):
    """Each fenced call returns once its semaphore reached the call's value (its work done), and a forward and a
    backward give the synchronous modules' bits, from two threads at once too."""
    import threading

    from nsa_iree import runtime

    problem = _problem(seed=2)
    synchronous = _forward_and_backward(*problem)
    request.getfixturevalue("fenced_cpu")
    invoke, fenced_calls = runtime.Module._invoke, []

    def checked_invoke(self, fn, variants, outputs, fenced):
        invoke(self, fn, variants, outputs, fenced)
        if fenced:
            timeline = self.device._timelines.__dict__
            fenced_calls.append(timeline["semaphore"].query() >= timeline["value"])

    monkeypatch.setattr(runtime.Module, "_invoke", checked_invoke)
    assert all(torch.equal(a, b) for a, b in zip(_forward_and_backward(*problem), synchronous))
    assert fenced_calls and all(fenced_calls), fenced_calls
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, _forward_and_backward(*problem)),
                                daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1]
    assert all(torch.equal(a, b) for got in results.values() for a, b in zip(got, synchronous))


def test_a_failed_fenced_call_leaves_the_next_ones_working(fenced_cpu):
    """A call that IREE refuses, and one whose semaphore failed, raise; the thread's next call works (it gets a new
    semaphore: a failed one fails every later fence on it)."""
    from nsa_iree import api

    q, k, v, idx, do = _problem(seed=3)
    o, lse = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    idx32 = api.effective_block_indices(idx, None)
    module = api.kernels(api.loaded_spec(api.describe(q, k, v, idx32, BS), "forward")[0], "forward", q.device)
    assert module._lookup("selection_attention_fwd")[2], "the module is not fenced"
    with pytest.raises(ValueError, match="INVALID_ARGUMENT"):                 # lse of the wrong shape
        module.call("selection_attention_fwd", q, k, v, idx32, BS ** -0.5, torch.empty_like(o), torch.empty(1))
    assert torch.equal(nsa_iree.selection_attention_fwd(q, k, v, idx, BS)[0], o)
    module.device._timelines.semaphore.fail("injected")
    with pytest.raises(Exception, match="injected"):
        nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    again = nsa_iree.selection_attention_fwd(q, k, v, idx, BS)
    assert torch.equal(again[0], o) and torch.equal(again[1], lse)


@pytest.mark.parametrize("outcome", ("signalled", "failed"))
def test_the_gpu_poll_returns_when_signalled_and_raises_when_failed(outcome):
    """runtime._spin_until, the GPU calls' wait, on a semaphore another thread signals or fails later."""
    import threading

    import iree.runtime as rt

    from nsa_iree import runtime

    semaphore = runtime.device_for(torch.device("cpu")).hal_device.create_semaphore(0)
    later = threading.Timer(0.05, semaphore.signal if outcome == "signalled" else semaphore.fail,
                            (1,) if outcome == "signalled" else ("injected",))
    later.start()
    if outcome == "signalled":
        runtime._spin_until(rt.HalFence.create_at(semaphore, 1))
        assert semaphore.query() == 1
    else:
        with pytest.raises(Exception, match="injected"):
            runtime._spin_until(rt.HalFence.create_at(semaphore, 1))
    later.join()


# --- no leak report at exit -------------------------------------------------------------------------------

def test_no_leak_report_at_exit(tmp_path, built):
    """The README example (small): outputs with their autograd graphs alive at exit, one after backward."""
    script = tmp_path / "readme.py"
    script.write_text(textwrap.dedent(f"""
        import torch, nsa_iree
        import nsa_iree.selection      # (the README's example relies on it being imported)

        B, M, H, G, D, Dv, BS, T = {B}, {M}, {H}, {G}, {D}, {DV}, {BS}, {T}
        q = torch.randn(B, M, H, D, requires_grad=True)
        k = torch.randn(B, M, G, D, requires_grad=True)
        v = torch.randn(B, M, G, Dv, requires_grad=True)
        block_indices = nsa_iree.selection.realistic_block_indices(B, M, M, G, T, BS)

        o = nsa_iree.selection_attention(q, k, v, block_indices, block_size=BS)
        o.sum().backward()
        o2 = nsa_iree.selection_attention(q, k, v, block_indices, block_size=BS)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env=_env(NSA_IREE_CACHE_DIR=cache_from(built, tmp_path / "cache")))
    assert_ok(result)
    assert "leaked" not in result.stderr, result.stderr[:3000]


def test_kept_results_are_released_before_exit(tmp_path):
    """A sliding-window and a compressed-attention backward keep their block lists' inversion on the device
    (nsa_iree.api: fixed_blocks), alive at exit with the cached block lists: the process exits cleanly, nothing
    reported leaked."""
    script = tmp_path / "kept.py"
    script.write_text(textwrap.dedent("""
        import torch, nsa_iree

        q = torch.randn(1, 130, 4, 16, requires_grad=True)
        k = torch.randn(1, 130, 2, 16, requires_grad=True)
        v = torch.randn(1, 130, 2, 16, requires_grad=True)
        nsa_iree.sliding_window_attention(q, k, v, 40).sum().backward()
        k_cmp = nsa_iree.mean_pooling(k, 16)
        nsa_iree.compressed_attention(q, k_cmp, k_cmp, 16)[0].sum().backward()
        print("ran")
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env=_env(NSA_IREE_CACHE_DIR=str(tmp_path / "cache")))
    assert_ok(result)
    assert result.stdout.strip() == "ran" and "leaked" not in result.stderr, result.stderr[:3000]


# --- command line -----------------------------------------------------------------------------------------

BAD_CLI_VALUES = {
    # argv -> what the one-line message must say
    "block size 0": (["compile", "--block-size", "0"], "--block-size must be a positive integer, got 0"),
    "negative heads": (["render", "--heads", "-4"], "--heads must be a positive integer, got -4"),
    "heads not a multiple": (["compile", "--heads", "3", "--kv-heads", "2"],
                             "--heads (3) must be a multiple of --kv-heads (2)"),
    "gpu block size": (["compile", "--target", "cuda", "--block-size", "16"], "target cuda supports block_size in"),
    "gpu dtype": (["inspect", "--target", "gfx950", "--dtype", "f32"], "target gfx950 supports dtypes"),
    "zero blocks": (["compile", "--num-blocks", "0"], "--num-blocks must be a positive integer, got 0"),
    "demo length": (["demo", "--seq-len", "0"], "--seq-len must be a positive integer, got 0"),
    "gpu target cpu": (["compile", "--target", "cuda", "--target-cpu", "x86-64-v3"],
                       "--target-cpu applies to the cpu target only"),
    "bad cpu name": (["render", "--target-cpu", "x86 64"], "--target-cpu must be 'host' or an LLVM CPU name"),
    "negative window": (["inspect", "--target", "gfx950", "--dtype", "bf16", "--window", "-1"],
                        "--window must be an int >= 0, got -1"),
}


@pytest.mark.parametrize("case", BAD_CLI_VALUES, ids=list(BAD_CLI_VALUES))
def test_cli_bad_values_are_one_line_errors(case, capsys, monkeypatch):
    import nsa_iree.compiler

    monkeypatch.setattr(nsa_iree.compiler, "compile_artifact", lambda *a, **k: pytest.fail("compiled a bad value"))
    argv, message = BAD_CLI_VALUES[case]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("nsa-iree: error: ") and err.count("\n") == 1, err
    assert message in err and not out


def test_cli_unwritable_output_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert cli.main(["compile", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--value-dim", "8",
                     "--block-size", "8", "--num-blocks", "2", "--dtype", "f32", "-o", str(blocker / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nsa-iree: error: ") and err.count("\n") == 1 and str(blocker / "out") in err


@pytest.mark.parametrize("command", ("compile", "inspect"))
def test_cli_directory_that_cannot_be_made_is_a_one_line_error(command, tmp_path, capsys, monkeypatch):
    import nsa_iree.compiler

    monkeypatch.setattr(nsa_iree.compiler, "compile_artifact", lambda *a, **k: pytest.fail("compiled first"))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    option = "-o" if command == "compile" else "--dump"
    assert cli.main([command, "--target", "cpu", option, str(blocker / "out")]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("nsa-iree: error: ") and err.count("\n") == 1, err
    assert f"{blocker / 'out'}: cannot create the directory" in err and not out


def test_cli_compiler_commands_never_import_torch_nor_print_iree_remarks(tmp_path):
    """render, compile and inspect run without torch (imported at 1-2 s it would be most of their start-up) and
    show only their own output (and nsa_iree's compile log lines): no IREE remark (inspect once printed one per
    module about benchmarks)."""
    script = textwrap.dedent(f"""
        import sys
        from nsa_iree import cli
        spec = ["--target", "cpu", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--value-dim", "8",
                "--block-size", "8", "--num-blocks", "2", "--dtype", "f32"]
        assert cli.main(["render", *spec]) == 0
        assert cli.main(["compile", *spec, "-o", {str(tmp_path / "out")!r}]) == 0
        assert cli.main(["inspect", *spec, "--variant", "forward", "--dump", {str(tmp_path / "dump")!r}]) == 0
        assert "torch" not in sys.modules, "torch was imported"
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(),
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert all(line.startswith("nsa_iree: compil") for line in result.stderr.splitlines()), result.stderr


def test_cli_runs_as_a_program_without_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nsa_iree.cli", "compile", "--block-size", "0"],
                            capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == ["nsa-iree: error: --block-size must be a positive integer, got 0"]


def test_a_kept_owner_freed_while_its_store_is_locked_does_not_hang():
    """A garbage collection inside Device.keep (which makes objects under the store's lock) may free another kept
    owner held by a reference cycle: that owner's finalizer then runs on the thread holding the lock, and must not
    wait for it."""
    import gc
    import threading

    from nsa_iree.runtime import device_for

    device = device_for(torch.device("cpu"))
    done = []

    def free_under_lock():
        class Holder:
            pass

        holder = Holder()
        holder.cycle, holder.owner = holder, torch.zeros(4, dtype=torch.int32)
        device.keep(holder.owner, ("test: freed under the lock",), "value")
        del holder
        with device._kept_lock:      # as keep() is when its finalize() or tuple starts a collection
            gc.collect()             # frees the cycle: the owner's finalizer runs here
            done.append(("test: freed under the lock",) not in device._kept)

    thread = threading.Thread(target=free_under_lock, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert done == [True], "the kept owner's finalizer waited for the lock its own thread held"
