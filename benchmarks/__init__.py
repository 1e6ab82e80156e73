"""loopdock's benchmarks (``loopdock bench``): many agents, human priority under load, the bridge,
against the bare trio channel floor and the autogen-core peer. See benchmarks/README.md.

Entry point: ``benchmarks._run.run(mode, out_dir)`` (kept out of this module so that the
autogen-core worker process never imports trio or loopdock)."""
from ._run import add_arguments as add_arguments
from ._run import run_from_args as run_from_args
