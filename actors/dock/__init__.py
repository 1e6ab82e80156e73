"""The loop dock: every agent chooses its own loop (register -> select -> bind -> delegate)."""

from ._builtin import BUILTIN_LOOPS as BUILTIN_LOOPS
from ._builtin import MINIMAL_FIRST as MINIMAL_FIRST
from ._builtin import STANDARD as STANDARD
from ._config import AgentEntry as AgentEntry
from ._config import DockConfig as DockConfig
from ._config import Route as Route
from ._config import config_to_dict as config_to_dict
from ._config import load_config as load_config
from ._config import parse_config as parse_config
from ._dock import LoopDock as LoopDock
from ._dock import StrategyDriver as StrategyDriver
from ._errors import DockError as DockError
from ._loops import DriverLoop as DriverLoop
from ._loops import Loop as Loop
from ._loops import LoopInfo as LoopInfo
from ._loops import StrategyLoop as StrategyLoop
from ._packages import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from ._packages import PackageReport as PackageReport
from ._packages import load_loop_packages as load_loop_packages
from ._presets import AgentPresets as AgentPresets
from ._presets import Preset as Preset
from ._presets import UnknownPresetError as UnknownPresetError
from ._selection import BINDING_EVENT as BINDING_EVENT
from ._selection import BINDING_KEY as BINDING_KEY
from ._selection import read_binding as read_binding
