"""`abx sandbox shell` sizes the remote terminal from the local one."""

import fcntl
import os
import struct
import termios

from agent_sandbox.surfaces.cli.shell_cmd import terminal_size


def test_an_unsized_pty_means_80x24_and_a_sized_one_is_kept() -> None:
    parent, child = os.openpty()
    try:
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        assert terminal_size(child) == (80, 24)  # was (1, 1): a one-column shell
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
        assert terminal_size(child) == (132, 50)
    finally:
        os.close(parent)
        os.close(child)
    with open(os.devnull) as not_a_terminal:
        assert terminal_size(not_a_terminal.fileno()) == (80, 24)
