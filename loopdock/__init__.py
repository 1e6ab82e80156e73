"""loopdock: a trio runtime in which every agent runs its own agent loop.

Everything a user imports comes from here:

    from loopdock import Runtime, StrategyLoop, DriverLoop, Reject

``Runtime.open(...)`` is the embedded entry point; the ``loopdock`` command (``demo``,
``run``, ``serve``, ``dsh-patch``, ``bench``) is ``loopdock._cli:main``. The layers below
(``actors``, ``bridge``, ``runtime``) hold the implementation.
"""

from actors import ENTER as ENTER
from actors import AgentActor as AgentActor
from actors import AgentContext as AgentContext
from actors import AgentHandle as AgentHandle
from actors import Command as Command
from actors import CommandContext as CommandContext
from actors import CommandResult as CommandResult
from actors import CreateAgentOptions as CreateAgentOptions
from actors import Driver as Driver
from actors import Enter as Enter
from actors import FakeDriver as FakeDriver
from actors import LiveEvent as LiveEvent
from actors import PreStep as PreStep
from actors import ReactDriver as ReactDriver
from actors import Reject as Reject
from actors import Reservation as Reservation
from actors import ResumeAgentOptions as ResumeAgentOptions
from actors import Setup as Setup
from actors import Turn as Turn
from actors import TurnBody as TurnBody
from actors import Verdict as Verdict
from actors import create_with_body as create_with_body
from actors import resume_with_body as resume_with_body
from actors.dock import DockConfig as DockConfig
from actors.dock import DockError as DockError
from actors.dock import DriverLoop as DriverLoop
from actors.dock import LoopInfo as LoopInfo
from actors.dock import Preset as Preset
from actors.dock import StrategyLoop as StrategyLoop
from actors.dock import read_binding as read_binding
from actors.loopx import LoopxSettings as LoopxSettings
from runtime import AgentOptions as AgentOptions
from runtime import Event as Event
from runtime import LoopdockError as LoopdockError
from runtime import Message as Message
from runtime import ProducerSource as ProducerSource
from runtime import SessionHeader as SessionHeader
from runtime import TextBlock as TextBlock
from runtime import UserSource as UserSource
from runtime import configure_logging as configure_logging
from runtime import user_message as user_message
from runtime.models import ModelAdapter as ModelAdapter
from runtime.models import ModelRequest as ModelRequest
from runtime.models import Reply as Reply
from runtime.models import ScriptedAdapter as ScriptedAdapter
from runtime.models import ToolCall as ToolCall
from runtime.skills import SkillCatalog as SkillCatalog
from runtime.tools import ShellPolicy as ShellPolicy
from runtime.tools import Tool as Tool
from runtime.tools import ToolContext as ToolContext

from ._runtime import Runtime as Runtime
