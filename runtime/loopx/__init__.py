"""The LoopX CLI client: typed calls to the only authority for goals, bindings, quota,
receipts, lifecycle and progress (see ``_client`` for the contract and the CLI facts)."""

from ._activation import Activation as Activation
from ._client import ATTEMPT_BACKOFF as ATTEMPT_BACKOFF
from ._client import HOST_SURFACE as HOST_SURFACE
from ._client import LOOPX_TURN_PATTERN as LOOPX_TURN_PATTERN
from ._client import MAX_ATTEMPTS as MAX_ATTEMPTS
from ._client import MAX_STDERR_BYTES as MAX_STDERR_BYTES
from ._client import MAX_STDOUT_BYTES as MAX_STDOUT_BYTES
from ._client import MAX_TASK_BODY_CHARS as MAX_TASK_BODY_CHARS
from ._client import LifecycleResult as LifecycleResult
from ._client import LoopxClient as LoopxClient
from ._client import LoopxFailure as LoopxFailure
from ._client import LoopxFailureResult as LoopxFailureResult
from ._client import LoopxOk as LoopxOk
from ._client import LoopxRequestError as LoopxRequestError
from ._client import LoopxResult as LoopxResult
from ._client import LoopxVersion as LoopxVersion
from ._client import MalformedOutput as MalformedOutput
from ._client import Recovery as Recovery
from ._client import SchedulerHint as SchedulerHint
from ._client import ShouldRun as ShouldRun
from ._client import SkillsResult as SkillsResult
from ._client import TaskBody as TaskBody
from ._client import ThreadBinding as ThreadBinding
from ._client import TodoProgress as TodoProgress
from ._client import TransportFailure as TransportFailure
from ._client import check_agent_id as check_agent_id
from ._client import check_goal_id as check_goal_id
from ._client import check_thread_id as check_thread_id
from ._client import check_turn_id as check_turn_id
from ._client import is_agent_id as is_agent_id
from ._client import is_goal_id as is_goal_id
from ._client import loopx_env as loopx_env
