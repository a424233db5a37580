"""pytest plugin: the conformance suite against a backend named on the command line.

    pytest -p refllm.testing.plugin --refllm-backend mypkg.backend:factory

runs one test per property (``refllm/testing/conformance.py``), each on
``--refllm-examples`` drawn cases, under ``--refllm-profile``. With no paths
on the command line the suite is all that runs; with paths, it runs with them.
A failing test prints the explanation of the smallest failing case, ending
with a one-line repro.

Without ``--refllm-backend`` the plugin only adds its options, and loading it
imports neither hypothesis nor torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from refllm.testing.configs import ARCHITECTURES, check_architectures
from refllm.testing.tolerances import PROFILES

SUITE = Path(__file__).with_name("conformance.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("refllm", "refllm conformance kit")
    group.addoption("--refllm-backend", metavar="MODULE:FACTORY", help="factory(checkpoint) -> the backend under test")
    group.addoption(
        "--refllm-profile", default="float32", choices=sorted(PROFILES), help="tolerance profile (default float32)"
    )
    group.addoption("--refllm-examples", type=int, default=25, metavar="N", help="cases per property (default 25)")
    group.addoption(
        "--refllm-arch",
        default=",".join(ARCHITECTURES),
        metavar="A,B",
        help="architectures to draw models from (default: all)",
    )
    group.addoption("--refllm-seed", type=int, default=None, metavar="N", help="fix hypothesis' draws")
    group.addoption(
        "--refllm-threads",
        type=int,
        default=None,
        metavar="N",
        help="numba/torch threads while checking (default: as set)",
    )


OPTIONS = pytest.StashKey[dict]()


def pytest_configure(config: pytest.Config) -> None:
    spec = config.getoption("refllm_backend")
    if not spec:
        return
    from refllm.testing.factories import load_factory

    try:  # a bad option is a usage error, reported before anything runs
        config.stash[OPTIONS] = dict(
            factory=load_factory(spec),
            spec=spec,
            profile=config.getoption("refllm_profile"),
            max_examples=config.getoption("refllm_examples"),
            architectures=check_architectures(config.getoption("refllm_arch").split(",")),
            seed=config.getoption("refllm_seed"),
            threads=config.getoption("refllm_threads"),
        )
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.append(str(SUITE))
    else:  # no paths given: the suite is the run
        config.args[:] = [str(SUITE)]


@pytest.fixture(scope="session")
def refllm_conformance(pytestconfig: pytest.Config) -> dict:
    """The options of ``refllm.testing.suite.run_properties`` given on the command line."""
    if OPTIONS not in pytestconfig.stash:
        pytest.skip("no --refllm-backend given")
    return pytestconfig.stash[OPTIONS]
