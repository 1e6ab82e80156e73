"""Skills: the catalog (ranked roots, shadowing, front matter, skipping, hot reload), the
``skill`` tool and ``/name`` expansion, all without a runtime."""

from pathlib import Path

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from loopdock import Message, ProducerSource, TextBlock, UserSource, user_message
from loopdock.runtime import SkillInvocationSource, ToolError
from loopdock.runtime.skills import (
    MAX_SKILL_BYTES,
    InvalidSkillError,
    SkillCatalog,
    expand_skill_invocations,
    parse_skill,
    skill_tool,
)
from loopdock.runtime.skills._watch import watch_supported
from loopdock.runtime.tools import ToolContext


def write_skill(root: Path, folder: str, body: str, *, description: str = "", name: str | None = None) -> Path:
    lines = ["---"]
    if name is not None:
        lines.append(f"name: {name}")
    if description:
        lines.append(f"description: {description}")
    lines += ["---", body]
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def dirs(tmp_path):
    """Every kind of root, each under its own directory, none created yet."""
    return {
        "project": tmp_path / "project",
        "custom": tmp_path / "custom",
        "dsh_home": tmp_path / "dsh",
        "agents_home": tmp_path / "agents",
    }


def catalog_for(dirs) -> SkillCatalog:
    """A catalog over the test's roots, scanned once (lookups answer from the last scan)."""
    catalog = SkillCatalog(
        dirs["project"],
        dsh_home=dirs["dsh_home"],
        agents_home=dirs["agents_home"],
        extra_dirs=[dirs["custom"]],
    )
    catalog.refresh()
    return catalog


ROOT_PATHS = {
    "project-dsh": lambda d: d["project"] / ".dsh" / "skills",
    "project-agents": lambda d: d["project"] / ".agents" / "skills",
    "custom-1": lambda d: d["custom"],
    "dsh-home": lambda d: d["dsh_home"] / "skills",
    "agents-home": lambda d: d["agents_home"] / "skills",
}


# -- roots, ranks and shadowing -----------------------------------------------------------


def test_roots_are_in_dsh_rank_order(dirs):
    catalog = catalog_for(dirs)
    assert [r.label for r in catalog.roots] == list(ROOT_PATHS)
    assert [r.path for r in catalog.roots] == [fn(dirs) for fn in ROOT_PATHS.values()]


def test_a_higher_ranked_root_shadows_a_lower_one_by_name(dirs):
    for label, root in ROOT_PATHS.items():
        write_skill(root(dirs), "demo", f"body from {label}", description=label)
    write_skill(ROOT_PATHS["agents-home"](dirs), "only-low", "low body")
    catalog = catalog_for(dirs)

    # Peel the roots off from the top: each time the next one down takes over.
    for rank, label in enumerate(ROOT_PATHS):
        catalog.refresh()
        skill = catalog.get("demo")
        assert (skill.root, skill.rank, skill.body, skill.description) == (
            label, rank, f"body from {label}", label,
        )
        (ROOT_PATHS[label](dirs) / "demo" / "SKILL.md").unlink()
    catalog.refresh()
    assert catalog.get("demo") is None
    assert [s.name for s in catalog.list()] == ["only-low"]


def test_list_is_sorted_and_one_skill_per_name(dirs):
    write_skill(ROOT_PATHS["dsh-home"](dirs), "zeta", "z")
    write_skill(ROOT_PATHS["project-dsh"](dirs), "alpha", "a")
    write_skill(ROOT_PATHS["custom-1"](dirs), "alpha", "shadowed")
    catalog = catalog_for(dirs)
    assert [(s.name, s.body) for s in catalog.list()] == [("alpha", "a"), ("zeta", "z")]


def test_the_same_directory_reached_twice_keeps_its_higher_rank(tmp_path):
    # project == $HOME: <project>/.agents/skills is also $DSH_AGENTS_HOME/skills.
    write_skill(tmp_path / ".agents" / "skills", "demo", "body")
    catalog = SkillCatalog(tmp_path, agents_home=tmp_path / ".agents")
    catalog.refresh()
    assert [r.label for r in catalog.roots] == ["project-dsh", "project-agents"]
    assert catalog.get("demo").root == "project-agents"


def test_from_env_reads_dsh_home_and_agents_home(tmp_path):
    env = {"DSH_HOME": str(tmp_path / "d"), "DSH_AGENTS_HOME": str(tmp_path / "a"), "HOME": str(tmp_path / "h")}
    catalog = SkillCatalog.from_env(tmp_path / "p", env)
    assert {r.label: r.path for r in catalog.roots} == {
        "project-dsh": tmp_path / "p" / ".dsh" / "skills",
        "project-agents": tmp_path / "p" / ".agents" / "skills",
        "dsh-home": tmp_path / "d" / "skills",
        "agents-home": tmp_path / "a" / "skills",
    }


def test_from_env_defaults_agents_home_to_home_dot_agents(tmp_path):
    catalog = SkillCatalog.from_env(None, {"HOME": str(tmp_path)})
    assert [(r.label, r.path) for r in catalog.roots] == [("agents-home", tmp_path / ".agents" / "skills")]
    assert SkillCatalog.from_env(None, {}).roots == ()


# -- front matter -----------------------------------------------------------------------


def test_front_matter_fields_and_body():
    text = "---\nname: demo\ndescription: Does a demo.\nversion: 2\ntags: [a, b]\n---\n\n# Demo\n\nStep one.\n\n"
    skill = parse_skill(text, "demo", rank=3, root="dsh-home")
    assert skill.name == "demo"
    assert skill.description == "Does a demo."
    assert skill.body == "# Demo\n\nStep one."
    assert dict(skill.metadata) == {"version": 2, "tags": ["a", "b"]}
    assert (skill.rank, skill.root) == (3, "dsh-home")


def test_name_defaults_to_the_folder_and_empty_front_matter_is_fine():
    skill = parse_skill("---\n---\nbody", "folder-name")
    assert (skill.name, skill.description, skill.body) == ("folder-name", "", "body")


def test_a_body_line_of_dashes_is_not_the_front_matter_end_twice():
    skill = parse_skill("---\ndescription: x\n---\nabove\n---\nbelow", "demo")
    assert skill.body == "above\n---\nbelow"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no front matter at all", "no front matter"),
        ("---\ndescription: [unclosed\n---\nbody", "not valid YAML"),
        ("---\n- a list\n---\nbody", "not a mapping"),
        ("---\nname: other\n---\nbody", "does not match its folder"),
        ("---\nname: 7\n---\nbody", "'name' is not a string"),
        ("---\ndescription: {a: 1}\n---\nbody", "'description' is not a string"),
        ("---\ndescription: x\nbody without an end", "no front matter"),
    ],
)
def test_malformed_skills_are_rejected_with_a_reason(text, reason):
    with pytest.raises(InvalidSkillError, match=reason) as info:
        parse_skill(text, "demo")
    assert info.value.code == "INVALID_SKILL"


def test_a_folder_name_that_cannot_be_a_slash_token_is_rejected():
    with pytest.raises(InvalidSkillError, match="must match"):
        parse_skill("---\n---\nbody", "has space")


def test_malformed_skills_are_skipped_with_a_warning_and_never_crash(dirs):
    root = ROOT_PATHS["project-dsh"](dirs)
    write_skill(root, "good", "good body")
    write_skill(root, "renamed", "body", name="something-else")
    (root / "broken").mkdir(parents=True)
    (root / "broken" / "SKILL.md").write_text("---\n: : :\n  - [\n---\nbody")
    (root / "binary").mkdir()
    (root / "binary" / "SKILL.md").write_bytes(b"---\n---\n\xff\xfe\xfa")
    (root / "huge").mkdir()
    (root / "huge" / "SKILL.md").write_text("---\n---\n" + "x" * (MAX_SKILL_BYTES + 1))
    (root / "no-skill-file").mkdir()  # not a skill, and not worth a warning
    (root / ".hidden").mkdir()
    (root / ".hidden" / "SKILL.md").write_text("---\n---\nhidden")
    (root / "stray-file.md").write_text("not a folder")
    # A lower-ranked valid skill takes the name of a higher-ranked broken one.
    write_skill(ROOT_PATHS["dsh-home"](dirs), "broken", "fallback body")

    with capture_logs() as logs:
        names = [s.name for s in catalog_for(dirs).list()]

    assert names == ["broken", "good"]
    skipped = {e["skill"]: e for e in logs if e["event"] == "skill skipped"}
    assert set(skipped) == {"renamed", "broken", "binary", "huge"}
    assert all(e["log_level"] == "warning" and e["root"] == "project-dsh" for e in skipped.values())
    # The warnings name a root label and a folder, never an absolute path.
    assert not any(str(dirs["project"]) in repr(e) for e in logs)


def test_missing_roots_are_simply_empty(dirs):
    catalog = catalog_for(dirs)
    assert catalog.list() == []
    assert catalog.get("anything") is None


# -- hot reload -----------------------------------------------------------------------------


def test_created_edited_and_deleted_skills_are_seen_by_the_next_refresh(dirs):
    catalog = catalog_for(dirs)
    assert catalog.get("demo") is None  # the root does not even exist yet

    path = write_skill(ROOT_PATHS["project-agents"](dirs), "demo", "version one")
    assert catalog.get("demo") is None  # a lookup never reads the disk
    catalog.refresh()
    assert catalog.get("demo").body == "version one"

    write_skill(ROOT_PATHS["project-agents"](dirs), "demo", "version two, longer", description="new")
    catalog.refresh()
    skill = catalog.get("demo")
    assert (skill.body, skill.description) == ("version two, longer", "new")

    # A higher-ranked copy appearing takes over at once, and leaving gives the name back.
    shadow = write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "shadow")
    catalog.refresh()
    assert catalog.get("demo").root == "project-dsh"
    shadow.unlink()
    catalog.refresh()
    assert catalog.get("demo").body == "version two, longer"

    path.unlink()
    catalog.refresh()
    assert catalog.get("demo") is None
    assert catalog.list() == []


def test_an_atomic_replace_with_the_same_size_is_seen(dirs):
    root = ROOT_PATHS["dsh-home"](dirs)
    path = write_skill(root, "demo", "AAAA")
    catalog = catalog_for(dirs)
    assert catalog.get("demo").body == "AAAA"
    replacement = path.with_name("SKILL.md.tmp")
    replacement.write_text(path.read_text().replace("AAAA", "BBBB"))
    replacement.replace(path)  # new inode, same size
    catalog.refresh()
    assert catalog.get("demo").body == "BBBB"


def test_an_unchanged_tree_is_not_rescanned(dirs, monkeypatch):
    write_skill(ROOT_PATHS["dsh-home"](dirs), "demo", "body")
    catalog = catalog_for(dirs)
    scans = []
    original = catalog._scan
    monkeypatch.setattr(catalog, "_scan", lambda: scans.append(1) or original())
    for _ in range(5):
        catalog.refresh()
        assert catalog.get("demo").body == "body"
    assert scans == []
    write_skill(ROOT_PATHS["dsh-home"](dirs), "other", "b")
    catalog.refresh()
    assert catalog.get("other") is not None
    assert scans == [1]


# -- the skill tool -------------------------------------------------------------------------


def ctx() -> ToolContext:
    return ToolContext(session_id="s1", cwd=Path("/nonexistent"), call_id="call-1")


async def test_the_skill_tool_returns_the_body(dirs):
    write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "Do the demo.", description="A demo")
    tool = skill_tool(catalog_for(dirs))
    assert tool.name == "skill"
    assert tool.spec.parameters["required"] == ["name"]
    assert await tool.run({"name": "demo"}, ctx()) == "Do the demo."


async def test_an_unknown_skill_is_a_tool_error_listing_the_available_ones(dirs):
    write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "x")
    write_skill(ROOT_PATHS["dsh-home"](dirs), "other", "y")
    tool = skill_tool(catalog_for(dirs))
    with pytest.raises(ToolError, match=r"unknown skill 'nope'; available skills: demo, other"):
        await tool.run({"name": "nope"}, ctx())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({}, "'name' must be"), ({"name": 3}, "'name' must be"), ({"name": "demo", "x": 1}, "unexpected argument")],
)
async def test_bad_skill_tool_arguments_are_tool_errors(dirs, arguments, message):
    write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "x")
    with pytest.raises(ToolError, match=message):
        await skill_tool(catalog_for(dirs)).run(arguments, ctx())


def test_the_tool_spec_lists_the_current_skills(dirs):
    catalog = catalog_for(dirs)
    tool = skill_tool(catalog)
    assert "No skills are installed." in tool.spec.description
    write_skill(ROOT_PATHS["dsh-home"](dirs), "demo", "x", description="Runs the demo")
    catalog.refresh()
    assert "- demo: Runs the demo" in tool.spec.description


async def test_nothing_the_model_sees_holds_an_absolute_path(dirs):
    for label, root in ROOT_PATHS.items():
        write_skill(root(dirs), f"s-{label}", f"body of {label}", description=f"from {label}")
    catalog = catalog_for(dirs)
    tool = skill_tool(catalog)
    seen = [tool.spec.description]
    for skill in catalog.list():
        seen.append(await tool.run({"name": skill.name}, ctx()))
        seen.append(repr(skill))
    with pytest.raises(ToolError) as info:
        await tool.run({"name": "missing"}, ctx())
    seen.append(str(info.value))
    assert len(seen) == 2 + 2 * len(ROOT_PATHS)
    base = str(dirs["project"].parent)
    assert not [text for text in seen if base in text]


# -- /name expansion --------------------------------------------------------------------------


@pytest.fixture
def demo_catalog(dirs):
    write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "# Demo\nFollow these steps.")
    return catalog_for(dirs)


@pytest.mark.parametrize("text", ["/demo do X", "/demo", "  /demo\nwith a second line"])
def test_a_person_typing_slash_name_gets_the_skill_body_injected(demo_catalog, text):
    original = user_message(text)
    expanded = expand_skill_invocations(original, demo_catalog)
    assert len(expanded) == 2
    assert expanded[0] is original
    injected = expanded[1]
    assert injected.role == "user"
    assert injected.text == "# Demo\nFollow these steps."
    assert injected.source == SkillInvocationSource(name="demo", form="instructions")
    assert injected.id != original.id


@pytest.mark.parametrize(
    "message",
    [
        user_message("/unknown do X"),
        user_message("please /demo do X"),
        user_message("/demo/path/like"),
        user_message("/demonstrate"),
        user_message("/demo", source=SkillInvocationSource(name="demo")),  # never re-expanded
        Message("user", (TextBlock("/demo do X"),), ProducerSource("test-driver")),
        Message("assistant", (TextBlock("/demo do X"),), UserSource()),
        Message("user", (TextBlock("/demo do X"),), None),
    ],
    ids=["unknown", "not-leading", "path", "prefix", "skill-source", "automatic", "assistant", "no-source"],
)
def test_everything_else_passes_through_unchanged(demo_catalog, message):
    assert expand_skill_invocations(message, demo_catalog) == (message,)


def test_the_tool_spec_is_rebuilt_only_when_the_catalog_changes(dirs, monkeypatch):
    write_skill(ROOT_PATHS["dsh-home"](dirs), "demo", "x", description="Runs the demo")
    catalog = catalog_for(dirs)
    tool = skill_tool(catalog)
    first = tool.spec
    generation = catalog.generation
    listings = []
    original = catalog.list
    monkeypatch.setattr(catalog, "list", lambda: listings.append(1) or original())
    for _ in range(3):
        catalog.refresh()
        assert tool.spec is first  # unchanged on disk: the cached spec, no new listing
    assert listings == [] and catalog.generation == generation

    # An edit in place, a new skill and a removal each invalidate it after the refresh.
    write_skill(ROOT_PATHS["dsh-home"](dirs), "demo", "x", description="Runs the new demo")
    catalog.refresh()
    assert "- demo: Runs the new demo" in tool.spec.description
    other = write_skill(ROOT_PATHS["project-dsh"](dirs), "other", "y", description="Another")
    catalog.refresh()
    assert "- other: Another" in tool.spec.description
    other.unlink()
    catalog.refresh()
    assert "other" not in tool.spec.description
    assert catalog.generation == generation + 3
    assert tool.spec is tool.spec


def test_refresh_reports_a_new_generation_only_after_a_change(dirs):
    catalog = catalog_for(dirs)
    generation = catalog.refresh()
    assert catalog.refresh() == generation
    write_skill(ROOT_PATHS["custom-1"](dirs), "demo", "x")
    assert catalog.refresh() == generation + 1
    assert catalog.get("demo") is not None and catalog.refresh() == generation + 1


# -- the change signal ----------------------------------------------------------------------


async def settled() -> None:
    """Return once every task is blocked: the watcher has then handled any inotify signal
    that a disk change made before this call raised (the kernel queues it before the
    write returns, and trio polls for I/O before it reports everything blocked)."""
    with trio.fail_after(10):
        await trio.testing.wait_all_tasks_blocked()


async def watching(catalog) -> None:
    """Return once the watcher has its watches in place again and no change is pending
    (it re-arms and rescans in worker threads after each change)."""
    with trio.fail_after(10):
        while not (catalog._live_watches == 1 and not catalog._signalled):
            await settled()


@pytest.mark.skipif(not watch_supported(), reason="needs inotify")
async def test_a_watched_catalog_looks_at_the_disk_only_after_a_change(dirs, monkeypatch):
    catalog = catalog_for(dirs)
    tool = skill_tool(catalog)
    looks: list[int] = []
    original = catalog._current_signature
    monkeypatch.setattr(catalog, "_current_signature", lambda: looks.append(1) or original())
    async with trio.open_nursery() as nursery:
        await nursery.start(catalog.watch)  # watching, and scanned
        await watching(catalog)
        assert "No skills are installed." in tool.spec.description
        looks.clear()
        for _ in range(5):
            await catalog.refreshed()  # what a model step does first
            assert "No skills are installed." in tool.spec.description
        assert looks == []  # nothing changed: no stat at all

        # A root that does not exist yet, created folder by folder, then the skill in it.
        write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "x", description="Demo")
        await catalog.refreshed()
        assert "- demo: Demo" in tool.spec.description
        # An edit in place, an atomic replace, a second root, a removal.
        await watching(catalog)
        path = write_skill(ROOT_PATHS["project-dsh"](dirs), "demo", "x", description="Edited")
        await catalog.refreshed()
        assert "- demo: Edited" in tool.spec.description
        await watching(catalog)
        replacement = path.with_name("SKILL.md.tmp")
        replacement.write_text(path.read_text().replace("Edited", "Edited!"))
        replacement.replace(path)
        await catalog.refreshed()
        assert "- demo: Edited!" in tool.spec.description
        await watching(catalog)
        other = write_skill(ROOT_PATHS["agents-home"](dirs), "other", "y", description="Other")
        await catalog.refreshed()
        assert "- other: Other" in tool.spec.description
        await watching(catalog)
        other.unlink()
        await catalog.refreshed()
        assert "other" not in tool.spec.description
        await watching(catalog)
        looks.clear()
        await catalog.refreshed()
        assert looks == []  # quiet again
        nursery.cancel_scope.cancel()
    assert catalog._live_watches == 0
    # No watcher any more: every refresh looks at the disk again.
    write_skill(ROOT_PATHS["custom-1"](dirs), "third", "z", description="Third")
    await catalog.refreshed()
    assert "- third: Third" in tool.spec.description


@pytest.mark.skipif(not watch_supported(), reason="needs inotify")
async def test_a_refresh_sees_a_change_before_the_watcher_handled_it(dirs):
    catalog = catalog_for(dirs)
    async with trio.open_nursery() as nursery:
        await nursery.start(catalog.watch)
        await watching(catalog)
        write_skill(ROOT_PATHS["dsh-home"](dirs), "demo", "now")
        assert not catalog._signalled  # no checkpoint yet: the watcher has not woken
        await catalog.refreshed()  # the kernel's queued signal is polled for
        assert catalog.get("demo").body == "now"
        nursery.cancel_scope.cancel()
