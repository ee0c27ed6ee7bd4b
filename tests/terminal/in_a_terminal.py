"""Runs a command with a pseudo-terminal as its stdin, stdout and stderr,
and keeps everything it draws there in a file: what a person at a terminal
would see, escape sequences included.

    in_a_terminal.py TRANSCRIPT -- COMMAND [ARG...]

The terminal is 120 columns by 40 rows. SIGTERM and SIGINT are passed on
to the command; the exit status is the command's (128 + N for signal N).
"""

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    transcript, command = sys.argv[1], sys.argv[3:]
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    child = subprocess.Popen(
        command, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True
    )
    os.close(terminal)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda received, _frame: child.send_signal(received))
    with open(transcript, "wb") as out:
        while True:
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: every holder of the terminal closed it
                break
            if not data:
                break
            out.write(data)
            out.flush()
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
