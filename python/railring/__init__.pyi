from ._errors import (
    BootstrapError as BootstrapError,
    Error as Error,
    InvalidArgumentError as InvalidArgumentError,
    MismatchError as MismatchError,
    PeerDeadError as PeerDeadError,
    PoisonedError as PoisonedError,
    TimeoutError as TimeoutError,
)
from ._railring import (
    DTYPES as DTYPES,
    OPS as OPS,
    Communicator as Communicator,
    Handle as Handle,
    init as init,
    version as version,
)

__version__: str
