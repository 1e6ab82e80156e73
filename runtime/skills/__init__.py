"""Skills: SKILL.md discovery with hot reload, the ``skill`` tool, and ``/name`` invocation."""

from ._catalog import MAX_SKILL_BYTES as MAX_SKILL_BYTES
from ._catalog import InvalidSkillError as InvalidSkillError
from ._catalog import Skill as Skill
from ._catalog import SkillCatalog as SkillCatalog
from ._catalog import SkillRoot as SkillRoot
from ._catalog import parse_skill as parse_skill
from ._invoke import SKILL_TOOL_NAME as SKILL_TOOL_NAME
from ._invoke import expand_skill_invocations as expand_skill_invocations
from ._invoke import invoked_skill_name as invoked_skill_name
from ._invoke import skill_tool as skill_tool
