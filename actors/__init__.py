"""The trio actors: sessions, agents, the store writer and the supervisor that owns them."""

from ._agent import ENTER as ENTER
from ._agent import AgentActor as AgentActor
from ._agent import Enter as Enter
from ._agent import InvalidReservationError as InvalidReservationError
from ._agent import PreStep as PreStep
from ._agent import Reject as Reject
from ._agent import Turn as Turn
from ._agent import TurnLoop as TurnLoop
from ._agent import Verdict as Verdict
from ._agent_context import AgentContext as AgentContext
from ._agent_context import UnknownHookError as UnknownHookError
from ._fanout import Fanout as Fanout
from ._fanout import Subscription as Subscription
from ._inbox import Placement as Placement
from ._inbox import Reservation as Reservation
from ._publication import publish_agent as publish_agent
from ._publication import run_setups as run_setups
from ._react import ReactDriver as ReactDriver
from ._react import ReactLoop as ReactLoop
from ._session import SessionActor as SessionActor
from ._session import SessionClosedError as SessionClosedError
from ._store_writer import StoreWriter as StoreWriter
from ._supervisor import LiveEvent as LiveEvent
from ._supervisor import RuntimeClosedError as RuntimeClosedError
from ._supervisor import Supervisor as Supervisor
from ._supervisor import UnknownServiceError as UnknownServiceError
