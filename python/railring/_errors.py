"""railring's errors as Python exceptions (raised by the native module).

The message is railring's own, word for word; the fields are attributes too.
"""

import builtins


class Error(RuntimeError):
    """A railring call failed. The communicator refuses further calls after a failed collective
    (a peer died, calls disagreed, a timeout): every rank of the job sees an error."""


class MismatchError(Error):
    """Ranks made different calls at the same point (kind, count, dtype, op or root differ).

    Attributes: ``rank`` (this rank), ``peer`` (the rank that disagreed), ``mine`` and
    ``theirs`` (both calls, spelled out)."""


class TimeoutError(Error, builtins.TimeoutError):
    """No progress for RAILRING_TIMEOUT seconds.

    Attributes: ``rank``, ``seconds``, ``waiting`` (the ranks not heard from), ``call``."""


class PeerDeadError(Error):
    """A peer rank is gone (its process died or its connection broke).

    Attributes: ``rank``, ``peer``, ``host``, ``why``."""


class InvalidArgumentError(Error, ValueError):
    """An argument railring cannot use: not contiguous, read-only, wrong dtype or length, a root
    or peer that is not a rank, an unknown op."""


class PoisonedError(Error):
    """The communicator failed earlier and refuses further calls; the message names the first
    failure."""


class BootstrapError(Error):
    """Joining the job failed: the bootstrap store could not be reached or authenticated, or a
    launcher variable is malformed."""


# Tracebacks say railring.MismatchError, the name users import.
for _cls in (Error, MismatchError, TimeoutError, PeerDeadError, InvalidArgumentError, PoisonedError, BootstrapError):
    _cls.__module__ = "railring"
