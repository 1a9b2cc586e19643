"""Errors raised by the data layer."""

from __future__ import annotations


class DataMissingError(RuntimeError):
    """A dataset's package is not installed: one line, ``"<what> is not installed; run `<command>`"``."""

    def __init__(self, what: str, install_command: str, *, detail: str | None = None) -> None:
        message = f"{what} is not installed; run `{install_command}`"
        if detail:
            message += f" ({detail})"
        message = " ".join(message.split())  # one line, whatever the parts held
        super().__init__(message)
        self.what = what
        self.install_command = install_command
        self.detail = detail

    def __reduce__(self) -> tuple[type[DataMissingError], tuple[str, str], dict[str, str | None]]:
        # picklable across processes
        return (type(self), (self.what, self.install_command), {"detail": self.detail, "args": self.args})
