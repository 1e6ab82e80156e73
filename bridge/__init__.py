"""The websocket bridge to DSH hosts and GoalBar clients.

A sans-IO protocol (``decode``/``encode``, the ``Connection`` state machine, the batching
``Outbox``) and a server around it (``serve_bridge``: h11 and wsproto under thin trio
adapters) that hands what peers send to a ``BridgeHandler``.
"""

from ._connection import CAPABILITIES as CAPABILITIES
from ._connection import CLOSE_INVALID_DATA as CLOSE_INVALID_DATA
from ._connection import CLOSE_POLICY_VIOLATION as CLOSE_POLICY_VIOLATION
from ._connection import CLOSE_PROTOCOL_ERROR as CLOSE_PROTOCOL_ERROR
from ._connection import CLOSE_TOO_LARGE as CLOSE_TOO_LARGE
from ._connection import Answered as Answered
from ._connection import Close as Close
from ._connection import Connection as Connection
from ._connection import ConnectionState as ConnectionState
from ._connection import Opened as Opened
from ._connection import Received as Received
from ._connection import SendFrame as SendFrame
from ._dock_select import DockSelectHandler as DockSelectHandler
from ._dsh_agent import DshAgent as DshAgent
from ._dsh_agent import DshAgentMirror as DshAgentMirror
from ._errors import BridgeClosedError as BridgeClosedError
from ._errors import ErrorCode as ErrorCode
from ._errors import LimitError as LimitError
from ._errors import NotServedError as NotServedError
from ._errors import ProtocolError as ProtocolError
from ._errors import RemoteError as RemoteError
from ._errors import RequestTimeoutError as RequestTimeoutError
from ._errors import TokenFileError as TokenFileError
from ._handler import BridgeHandler as BridgeHandler
from ._handler import Disconnect as Disconnect
from ._handler import HandlerLayer as HandlerLayer
from ._handler import NullHandler as NullHandler
from ._handler import Peer as Peer
from ._host_handler import HostCommandError as HostCommandError
from ._host_handler import HostHandler as HostHandler
from ._host_handler import NoHostError as NoHostError
from ._messages import MESSAGE_TYPES as MESSAGE_TYPES
from ._messages import Ack as Ack
from ._messages import BridgeMessage as BridgeMessage
from ._messages import Cancel as Cancel
from ._messages import CommandDone as CommandDone
from ._messages import ErrorNotice as ErrorNotice
from ._messages import Events as Events
from ._messages import Followup as Followup
from ._messages import Frame as Frame
from ._messages import Hello as Hello
from ._messages import Live as Live
from ._messages import Ping as Ping
from ._messages import Pong as Pong
from ._messages import PreStep as PreStep
from ._messages import Role as Role
from ._messages import RunCommand as RunCommand
from ._messages import Select as Select
from ._messages import Selection as Selection
from ._messages import SelectionParts as SelectionParts
from ._messages import SessionEvent as SessionEvent
from ._messages import Verdict as Verdict
from ._messages import Wake as Wake
from ._messages import Welcome as Welcome
from ._outbox import BATCH_BYTES as BATCH_BYTES
from ._outbox import BATCH_ITEMS as BATCH_ITEMS
from ._outbox import OUTBOX_BUDGET as OUTBOX_BUDGET
from ._outbox import OUTBOX_BYTES as OUTBOX_BYTES
from ._outbox import OUTBOX_SIZE as OUTBOX_SIZE
from ._outbox import Outbox as Outbox
from ._outbox import OutboxBudget as OutboxBudget
from ._protocol import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._protocol import decode as decode
from ._protocol import encode as encode
from ._server import DEFAULT_HOST as DEFAULT_HOST
from ._server import ENDPOINTS as ENDPOINTS
from ._server import MAX_MESSAGE_SIZE as MAX_MESSAGE_SIZE
from ._server import REQUEST_TIMEOUT as REQUEST_TIMEOUT
from ._server import BridgeConnection as BridgeConnection
from ._server import serve_bridge as serve_bridge
from ._token import load_or_create_token as load_or_create_token
