"""A process's file descriptors 1 and 2 pass through redaction (worker/output_capture.py).

Each case runs in a child Python process whose fds 1 and 2 are pipes this test reads: the child
captures its output, makes a secret known, then writes it below Python (``os.write``, a
subprocess, a write split in two, a line too long to hold, a line that never ends) and releases
its output before it exits. What reaches this test must hold no form of the secret, and
everything else the child wrote, in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from threads_celery.worker.output_capture import LONG_LINE

SECRET = 'sk-live-"q\'uo\\te"-ünï-canary-0123456789'


def run_child_raw(body: str, *, capture: bool = True) -> tuple[bytes, bytes]:
    script = (
        textwrap.dedent(
            f"""
        import os, subprocess, sys, time
        from threads_celery.redaction import remember_secrets
        from threads_celery.worker.output_capture import capture_output, is_captured, release_output
        SECRET = {SECRET!r}
        RAW = SECRET.encode()
        if {capture!r}:
            capture_output()
            assert is_captured(1) and is_captured(2)
        remember_secrets([SECRET])
        """
        )
        + textwrap.dedent(body)
        + "\nrelease_output()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout, done.stderr


def run_child(body: str, *, capture: bool = True) -> tuple[str, str]:
    out, err = run_child_raw(body, capture=capture)
    return out.decode(errors="replace"), err.decode(errors="replace")


def leaks(text: str) -> list[str]:
    forms = [SECRET, json.dumps(SECRET)[1:-1], repr(SECRET)[1:-1], "canary-0123"]
    return [form for form in forms if form in text]


def test_os_write_on_both_descriptors_is_redacted() -> None:
    out, err = run_child(
        """
        os.write(1, b"one: " + RAW + b"\\n")
        os.write(2, b"two: " + repr(SECRET).encode() + b"\\n")
        """
    )
    assert out == "one: ***\n" and err == "two: '***'\n"


def test_without_the_capture_the_same_writes_leak() -> None:
    out, _ = run_child('os.write(1, b"one: " + RAW + b"\\n")', capture=False)
    assert SECRET in leaks(out)


def test_a_subprocess_inherits_the_redacting_pipe() -> None:
    out, _ = run_child(
        """
        subprocess.run(["sh", "-c", 'printf "child says %s\\\\n" "$KEY"'], env={"KEY": SECRET}, check=True)
        """
    )
    assert out == "child says ***\n"


def test_a_secret_split_across_two_writes_is_still_found() -> None:
    out, _ = run_child(
        """
        os.write(1, b"split: " + RAW[:11])
        time.sleep(0.01)
        os.write(1, RAW[11:] + b" end\\n")
        """
    )
    assert out == "split: *** end\n"


def test_an_unfinished_line_goes_out_after_a_while_and_at_release() -> None:
    out, _ = run_child(
        """
        os.write(1, b"prompt> ")
        time.sleep(0.5)  # longer than the hold: it went out on its own
        os.write(1, b"tail without newline " + RAW)
        """
    )
    assert out == "prompt> tail without newline ***"


def test_a_line_longer_than_the_hold_is_cut_where_no_secret_straddles() -> None:
    out, _ = run_child(
        """
        from threads_celery.redaction import redactor_for
        from threads_celery.worker import output_capture
        held_back = redactor_for(frozenset([SECRET])).longest
        # The reader keeps the last `held_back` characters of a long line: here that point falls
        # ten characters before the secret's end, so the cut must move to the secret's start.
        os.write(1, b"x" * output_capture.LONG_LINE + RAW + b"y" * (held_back - 10))
        time.sleep(0.5)
        os.write(1, b"\\n")
        """
    )
    assert leaks(out) == []
    assert out == "x" * LONG_LINE + "***" + "y" * (len(out) - LONG_LINE - 4) + "\n"


def test_bytes_that_are_not_utf8_pass_unchanged() -> None:
    out, _ = run_child_raw(
        """
        os.write(1, b"\\xff\\xfe binary " + RAW + b" \\xc3\\n")
        """
    )
    assert out == b"\xff\xfe binary *** \xc3\n"
