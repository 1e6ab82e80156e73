"""loopdock: a trio runtime in which every agent runs its own agent loop.

Everything a user imports comes from here:

    from loopdock import Runtime, StrategyLoop, DriverLoop, Reject

``Runtime.open(...)`` is the embedded entry point, ``open_cluster(url)`` the entry to
the agents of a Redis cluster, ``rt.serve_bridge()`` serves DSH hosts from an embedded
runtime; the ``loopdock`` command (``demo``, ``run``, ``serve``, ``worker``, ...) is
``loopdock._cli:main``. Every error a user may catch derives from ``LoopdockError`` and
is named here. The layers below (``actors``, ``bridge``, ``runtime``) hold the
implementation; each is entered through its own package, never its private modules.
"""

from loopdock.actors import ENTER as ENTER
from loopdock.actors import PASSIVATE_AFTER as PASSIVATE_AFTER
from loopdock.actors import Agent as Agent
from loopdock.actors import AgentContext as AgentContext
from loopdock.actors import AgentHandle as AgentHandle
from loopdock.actors import AgentReservation as AgentReservation
from loopdock.actors import Approval as Approval
from loopdock.actors import Command as Command
from loopdock.actors import CommandContext as CommandContext
from loopdock.actors import CommandResult as CommandResult
from loopdock.actors import CreateAgentOptions as CreateAgentOptions
from loopdock.actors import Driver as Driver
from loopdock.actors import DuplicateCommandError as DuplicateCommandError
from loopdock.actors import Enter as Enter
from loopdock.actors import FakeDriver as FakeDriver
from loopdock.actors import InvalidCommandError as InvalidCommandError
from loopdock.actors import InvalidReservationError as InvalidReservationError
from loopdock.actors import LiveEvent as LiveEvent
from loopdock.actors import PreStep as PreStep
from loopdock.actors import ReactDriver as ReactDriver
from loopdock.actors import Reject as Reject
from loopdock.actors import Reservation as Reservation
from loopdock.actors import ResumeAgentOptions as ResumeAgentOptions
from loopdock.actors import RuntimeClosedError as RuntimeClosedError
from loopdock.actors import SessionClosedError as SessionClosedError
from loopdock.actors import Setup as Setup
from loopdock.actors import Turn as Turn
from loopdock.actors import UnknownAgentError as UnknownAgentError
from loopdock.actors import UnknownCommandError as UnknownCommandError
from loopdock.actors import UnknownHookError as UnknownHookError
from loopdock.actors import UnknownServiceError as UnknownServiceError
from loopdock.actors import Verdict as Verdict
from loopdock.actors import create_with_body as create_with_body
from loopdock.actors import resume_with_body as resume_with_body
from loopdock.actors.dock import DockConfig as DockConfig
from loopdock.actors.dock import DockError as DockError
from loopdock.actors.dock import DriverLoop as DriverLoop
from loopdock.actors.dock import LoopInfo as LoopInfo
from loopdock.actors.dock import Preset as Preset
from loopdock.actors.dock import StrategyLoop as StrategyLoop
from loopdock.actors.dock import UnknownPresetError as UnknownPresetError
from loopdock.actors.dock import read_binding as read_binding
from loopdock.actors.loopx import LoopxSettings as LoopxSettings
from loopdock.bridge import BridgeClosedError as BridgeClosedError
from loopdock.bridge import DshAgent as DshAgent
from loopdock.bridge import DshAgentClosedError as DshAgentClosedError
from loopdock.bridge import NotServedError as NotServedError
from loopdock.bridge import RemoteError as RemoteError
from loopdock.bridge import RequestTimeoutError as RequestTimeoutError
from loopdock.runtime import GC_THRESHOLD as GC_THRESHOLD
from loopdock.runtime import AgentBusyError as AgentBusyError
from loopdock.runtime import AgentClosedError as AgentClosedError
from loopdock.runtime import AgentOptions as AgentOptions
from loopdock.runtime import AgentPassivatedError as AgentPassivatedError
from loopdock.runtime import AgentReactivationError as AgentReactivationError
from loopdock.runtime import ApprovalClosedError as ApprovalClosedError
from loopdock.runtime import ApprovalPolicy as ApprovalPolicy
from loopdock.runtime import ClusterConfigError as ClusterConfigError
from loopdock.runtime import ClusterRequestError as ClusterRequestError
from loopdock.runtime import ClusterUnreachableError as ClusterUnreachableError
from loopdock.runtime import ClusterUrlError as ClusterUrlError
from loopdock.runtime import DuplicateToolError as DuplicateToolError
from loopdock.runtime import Event as Event
from loopdock.runtime import EventsTrimmedError as EventsTrimmedError
from loopdock.runtime import HomeInUseError as HomeInUseError
from loopdock.runtime import InvalidMessageError as InvalidMessageError
from loopdock.runtime import InvalidOptionsError as InvalidOptionsError
from loopdock.runtime import InvalidSessionIdError as InvalidSessionIdError
from loopdock.runtime import LoopdockError as LoopdockError
from loopdock.runtime import Message as Message
from loopdock.runtime import MessageRefusedError as MessageRefusedError
from loopdock.runtime import ModelError as ModelError
from loopdock.runtime import ModelRejectedError as ModelRejectedError
from loopdock.runtime import ModelStreamBrokenError as ModelStreamBrokenError
from loopdock.runtime import NoWorkerError as NoWorkerError
from loopdock.runtime import PortInUseError as PortInUseError
from loopdock.runtime import ProducerSource as ProducerSource
from loopdock.runtime import RegistryMismatchError as RegistryMismatchError
from loopdock.runtime import SessionExistsError as SessionExistsError
from loopdock.runtime import SessionHeader as SessionHeader
from loopdock.runtime import SessionLog as SessionLog
from loopdock.runtime import SessionNotFoundError as SessionNotFoundError
from loopdock.runtime import SetupError as SetupError
from loopdock.runtime import StoreUnusableError as StoreUnusableError
from loopdock.runtime import SubscriberDroppedError as SubscriberDroppedError
from loopdock.runtime import TextBlock as TextBlock
from loopdock.runtime import ToolError as ToolError
from loopdock.runtime import TranscriptNotInMemoryError as TranscriptNotInMemoryError
from loopdock.runtime import UnknownAdapterError as UnknownAdapterError
from loopdock.runtime import UnknownEventTypeError as UnknownEventTypeError
from loopdock.runtime import UnknownToolError as UnknownToolError
from loopdock.runtime import UserSource as UserSource
from loopdock.runtime import configure_logging as configure_logging
from loopdock.runtime import user_message as user_message
from loopdock.runtime.models import DuplicateAdapterError as DuplicateAdapterError
from loopdock.runtime.models import ModelAdapter as ModelAdapter
from loopdock.runtime.models import ModelRequest as ModelRequest
from loopdock.runtime.models import Reply as Reply
from loopdock.runtime.models import ScriptedAdapter as ScriptedAdapter
from loopdock.runtime.models import ToolCall as ToolCall
from loopdock.runtime.skills import SkillCatalog as SkillCatalog
from loopdock.runtime.tools import ShellPolicy as ShellPolicy
from loopdock.runtime.tools import Tool as Tool
from loopdock.runtime.tools import ToolContext as ToolContext

from ._bridge import Bridge as Bridge
from ._open_cluster import open_cluster as open_cluster
from ._runtime import Runtime as Runtime
