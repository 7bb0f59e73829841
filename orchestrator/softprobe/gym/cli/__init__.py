"""The ``softprobe-gym`` command line: demo, images, eval, grade, bench, check, gc."""

from softprobe.gym.cli.main import main

__all__ = ["main"]
