"""One source per default: what the operator passes to session pods, what ``heddle
session`` assumes when a flag is left out, and what ``heddle operator`` assumes, are the
defaults of :class:`SessionPodOptions` and :class:`OperatorConfig`, written once."""

from __future__ import annotations

from pathlib import Path

import pytest

from heddle.cli._main import build_parser
from heddle.cli._run import operator_config
from heddle.cli._session import session_pod_config
from heddle.operator import OperatorConfig, SessionPodConfig, SessionPodOptions
from heddle.rollout import DATA_ROOT, SessionConfig


def test_the_operator_passes_the_session_pod_defaults_unless_told_otherwise() -> None:
    pod, options = SessionPodOptions(), OperatorConfig().session_pod_options()
    assert (
        options.image,
        options.base_dir,
        options.status_interval_s,
        options.metrics_port,
        options.session,
    ) == (pod.image, pod.base_dir, pod.status_interval_s, pod.metrics_port, pod.session)
    assert pod.metrics_port == 9090  # docs/operator.md: each session pod serves /metrics there
    assert pod.base_dir == DATA_ROOT
    told = SessionPodConfig(namespace="ns", job="j")
    assert (told.base_dir, told.status_interval_s) == (pod.base_dir, pod.status_interval_s)
    assert told.metrics_port == OperatorConfig().session_metrics_port


def test_the_operators_settings_map_onto_each_session_pod() -> None:
    config = OperatorConfig(
        session_image="registry/heddle:2",
        data_root=Path("/work"),
        status_interval_s=0.5,
        session_metrics_port=0,
        session=SessionConfig(step_timeout_s=30.0),
    )
    options = config.session_pod_options()
    assert (options.image, options.base_dir, options.status_interval_s) == (
        "registry/heddle:2",
        Path("/work"),
        0.5,
    )
    assert (options.metrics_port, options.session, options.policy) == (
        0,
        SessionConfig(step_timeout_s=30.0),
        config.pod_policy,
    )


def test_heddle_operator_without_flags_keeps_the_dataclass_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HEDDLE_SESSION_IMAGE", raising=False)
    config = operator_config(build_parser().parse_args(["operator"]))
    default = OperatorConfig()
    for name in (
        "metrics_port",
        "drain_timeout_s",
        "data_root",
        "session_image",
        "session_metrics_port",
        "status_interval_s",
        "session",
    ):
        assert getattr(config, name) == getattr(default, name), name


def test_heddle_operator_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEDDLE_SESSION_IMAGE", raising=False)
    args = build_parser().parse_args(
        ["operator", "--metrics-port", "0", "--drain-timeout", "5", "--data-root", "/work",
         "--session-image", "registry/heddle:2", "--session-metrics-port", "0"]
    )  # fmt: skip
    config = operator_config(args)
    assert config.metrics_port is None  # 0: off
    assert (config.drain_timeout_s, config.data_root) == (5.0, Path("/work"))
    assert (config.session_image, config.session_metrics_port) == ("registry/heddle:2", 0)


def test_heddle_session_without_flags_keeps_the_dataclass_defaults() -> None:
    args = build_parser().parse_args(["session", "--namespace", "ns", "--job", "j"])
    session = SessionConfig(step_timeout_s=30.0)
    assert session_pod_config(args, session) == SessionPodConfig(
        namespace="ns", job="j", session=session
    )


def test_heddle_session_flags_reach_the_config() -> None:
    args = build_parser().parse_args(
        ["session", "--namespace", "ns", "--job", "j", "--base-dir", "/work",
         "--status-interval", "2.5", "--metrics-port", "0", "--gateway-host", "127.0.0.1",
         "--gateway-port", "9000", "--trainer-port", "8081"]
    )  # fmt: skip
    config = session_pod_config(args, SessionConfig())
    assert (config.base_dir, config.status_interval_s, config.poll_s) == (Path("/work"), 2.5, 1.0)
    assert (config.metrics_port, config.gateway_host) == (0, "127.0.0.1")
    assert (config.gateway_port, config.trainer_port) == (9000, 8081)
