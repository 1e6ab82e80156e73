"""The LoopX integration's actors: the per-agent continuation, ``/loopx-init`` and the
start-up initialisation, and the switch that attaches them to a runtime."""

from ._continuation import ContinuationMemo as ContinuationMemo
from ._continuation import ContinuationStatus as ContinuationStatus
from ._continuation import ContinuedAgent as ContinuedAgent
from ._continuation import LoopxContinuation as LoopxContinuation
from ._history import CONTINUATION_KIND as CONTINUATION_KIND
from ._history import ContinuationHistory as ContinuationHistory
from ._init import INIT_COMMAND_NAME as INIT_COMMAND_NAME
from ._init import INIT_SOURCE_KIND as INIT_SOURCE_KIND
from ._init import InitOutcome as InitOutcome
from ._init import InitSettings as InitSettings
from ._init import InitTarget as InitTarget
from ._init import initialize as initialize
from ._init import loopx_init_command as loopx_init_command
from ._init import run_loopx_init as run_loopx_init
from ._init import startup_initialize as startup_initialize
from ._integration import LoopxIntegration as LoopxIntegration
from ._integration import LoopxSettings as LoopxSettings
