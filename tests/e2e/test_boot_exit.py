"""How a script's worker ends (``harness.worker.boot.leave``): what the script set up for its exit happens,
and the interpreter's teardown, in which torch 2.13's gloo threads can abort a finished worker, does not."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_finished_worker_runs_its_exit_handlers_flushes_its_files_and_skips_the_teardown(tmp_path: Path) -> None:
    (tmp_path / "held.py").write_text(textwrap.dedent(f"""
        class Witness:
            def __del__(self):  # runs when the interpreter tears its modules down, not before
                open({str(tmp_path / "teardown")!r}, "w").close()
        WITNESS = Witness()
    """))
    (tmp_path / "train.py").write_text(textwrap.dedent(f"""
        import atexit
        import held  # kept by sys.modules until the teardown
        LOG = open({str(tmp_path / "log")!r}, "w")  # never closed: flushed when the script's globals go
        LOG.write("x" * 100)
        def main():
            atexit.register(lambda: open({str(tmp_path / "atexit")!r}, "w").write("ran"))
            print("done", flush=False)
        main()
    """))
    boot = textwrap.dedent(f"""
        import runpy, sys
        sys.path.insert(0, {str(tmp_path)!r})
        runpy.run_path({str(tmp_path / "train.py")!r}, run_name="__main__")  # as the boot module runs it
        from harness.worker.boot import leave
        leave(3)
    """)
    done = subprocess.run([sys.executable, "-c", boot], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "done\n"  # the stream flushed before the exit
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "log").read_text() == "x" * 100  # the script's globals collected: its file flushed
    assert not (tmp_path / "teardown").exists()  # no interpreter teardown
