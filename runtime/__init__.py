"""The lowest layer: the session-log model (events, messages, sources), serialisation,
options, errors, the session store, model adapters, tools, skills and the LoopX client."""

from ._errors import *  # noqa: F403  (the flat error set is public)
from ._events import KNOWN_EVENT_TYPES as KNOWN_EVENT_TYPES
from ._events import Event as Event
from ._events import SessionHeader as SessionHeader
from ._gc import GC_THRESHOLD as GC_THRESHOLD
from ._logging import configure_logging as configure_logging
from ._messages import Message as Message
from ._messages import ProducerSource as ProducerSource
from ._messages import SkillInvocationSource as SkillInvocationSource
from ._messages import TextBlock as TextBlock
from ._messages import ToolSource as ToolSource
from ._messages import UserSource as UserSource
from ._messages import user_message as user_message
from ._options import AgentOptions as AgentOptions
from ._session_log import SessionLog as SessionLog

