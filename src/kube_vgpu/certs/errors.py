"""The failures `kube-vgpu certs` reports, each with the exit code the command ends with.

    CertsError                 base; `str()` is the one line the CLI prints
    ├── UsageError             bad flags or arguments (exit 2, as argparse's own errors)
    ├── NotFoundError          the Secret or webhook configuration to read does not exist (exit 3)
    ├── InvalidError           an object exists but cannot be used as it is (exit 4)
    ├── PermissionDeniedError  RBAC refused a verb on a resource (exit 5)
    └── UnreachableError       no API server answered, or no usable credentials (exit 6)

Anything else the API server refuses (an unexpected status, conflicts that never settle) is a plain
`CertsError` (exit 1).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_INVALID = 4
EXIT_FORBIDDEN = 5
EXIT_UNREACHABLE = 6


class CertsError(Exception):
    """A failure the CLI reports as one line, exiting with `exit_code`."""

    exit_code = EXIT_FAILED


class UsageError(CertsError):
    """Flags or arguments that cannot work together."""

    exit_code = EXIT_USAGE


class NotFoundError(CertsError):
    """An object the command reads does not exist."""

    exit_code = EXIT_NOT_FOUND


class InvalidError(CertsError):
    """An object exists but its content cannot be used (and is not ours to overwrite)."""

    exit_code = EXIT_INVALID


class PermissionDeniedError(CertsError):
    """The API server's RBAC refused a request; the message names the verb and the resource."""

    exit_code = EXIT_FORBIDDEN


class UnreachableError(CertsError):
    """The API server could not be reached (the message names its URL) or no credentials were found."""

    exit_code = EXIT_UNREACHABLE
