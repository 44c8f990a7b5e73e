"""heddle.bench: ``heddle bench`` and its component benchmarks (docs/benchmarks.md).

The policy comparison in the simulator (``_sim``), and measurements on real
workers: the session, fidelity of the simulator, the gateway, memory, weights,
the worker API, placement and the predictor.
"""

from ._acceptance import format_acceptance, run_acceptance
from ._fidelity import (
    bench_fidelity,
    fidelity_cluster,
    fidelity_speculation,
    format_fidelity,
    outside_engine_per_step,
    pairs_agree,
    parse_fidelity_speculation,
    replayed_acceptance,
    run_fidelity,
    simulate,
    tokenized_scripts,
)
from ._gateway import (
    CALLS_PER_EPISODE,
    bench_gateway,
)
from ._iterations import ITERATION_CAPS, format_iterations, run_iteration_bench
from ._memory import (
    bench_memory,
)
from ._micro import (
    bench_placement,
    bench_predictor,
    bench_shape,
    chunked,
)
from ._profile import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    bench_profile,
    model_spec_of,
)
from ._session import (
    bench_control_loop,
    bench_engines,
    parse_worker_speculation,
    plot_engines,
    run_session_bench,
)
from ._sim import (
    ABLATION,
    DEFAULT_CAPS,
    Progress,
    Run,
    baseline_runs,
    format_table,
    parse_speculation,
    plot,
    run_rollout_bench,
)
from ._spec_replay import (
    ReplayedRequest,
    StepTokens,
    k_for_batch,
    replay_engines,
    requests_of,
)
from ._weights import (
    bench_weights,
)
from ._worker import (
    bench_worker,
)

__all__ = [
    "ABLATION",
    "CALLS_PER_EPISODE",
    "DEFAULT_BATCHES",
    "DEFAULT_CAPS",
    "DEFAULT_CONTEXTS",
    "ITERATION_CAPS",
    "Progress",
    "ReplayedRequest",
    "Run",
    "StepTokens",
    "baseline_runs",
    "bench_control_loop",
    "bench_engines",
    "bench_fidelity",
    "bench_gateway",
    "bench_memory",
    "bench_placement",
    "bench_predictor",
    "bench_profile",
    "bench_shape",
    "bench_weights",
    "bench_worker",
    "chunked",
    "fidelity_cluster",
    "fidelity_speculation",
    "format_acceptance",
    "format_fidelity",
    "format_iterations",
    "format_table",
    "k_for_batch",
    "model_spec_of",
    "outside_engine_per_step",
    "pairs_agree",
    "parse_fidelity_speculation",
    "parse_speculation",
    "parse_worker_speculation",
    "plot",
    "plot_engines",
    "replay_engines",
    "replayed_acceptance",
    "requests_of",
    "run_acceptance",
    "run_fidelity",
    "run_iteration_bench",
    "run_rollout_bench",
    "run_session_bench",
    "simulate",
    "tokenized_scripts",
]
