"""loopdock's runtime: the embedded API, the session-log model and the registries."""

from ._commands import Command as Command
from ._commands import CommandContext as CommandContext
from ._commands import CommandRegistry as CommandRegistry
from ._commands import CommandResult as CommandResult
from ._commands import DuplicateCommandError as DuplicateCommandError
from ._commands import InvalidCommandError as InvalidCommandError
from ._commands import UnknownAgentError as UnknownAgentError
from ._commands import UnknownCommandError as UnknownCommandError
from ._driver import AgentHandle as AgentHandle
from ._driver import CreateAgentOptions as CreateAgentOptions
from ._driver import Driver as Driver
from ._driver import ResumeAgentOptions as ResumeAgentOptions
from ._errors import *  # noqa: F403  (the flat error set is public)
from ._events import Event as Event
from ._events import KNOWN_EVENT_TYPES as KNOWN_EVENT_TYPES
from ._events import SessionHeader as SessionHeader
from ._messages import Message as Message
from ._messages import ProducerSource as ProducerSource
from ._messages import SkillInvocationSource as SkillInvocationSource
from ._messages import TextBlock as TextBlock
from ._messages import ToolSource as ToolSource
from ._messages import UserSource as UserSource
from ._messages import user_message as user_message
from ._logging import configure_logging as configure_logging
from ._options import AgentOptions as AgentOptions
from .dock import DockError as DockError
from .dock import DriverLoop as DriverLoop
from .dock import StrategyLoop as StrategyLoop


def __getattr__(name: str) -> object:
    # Runtime sits on top of the actors, which import this package's value modules:
    # loading it lazily lets `import actors` and `import runtime` come in either order.
    if name == "Runtime":
        from ._runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
