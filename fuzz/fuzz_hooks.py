"""Coverage-guided fuzzing of every hook and admission route (atheris). Run with `make fuzz`;
not part of CI.

A finding is any answer other than 200 or 4xx with a JSON body, or an exception escaping Flask.
The admission routes are posted over HTTPS (they refuse plain HTTP) and read a fixed tenancy with
a bounded tenant, so that the fuzzer reaches the budget arithmetic rather than a network error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["hooks"]):
    from hooks.routes import HOOKS
    from hooks.rules.budget.keys import TOTAL_KEY, class_key
    from hooks.rules.budget.tenancy import Tenancy, Tenant
    from hooks.rules.classes import ClassIdentity
    from hooks.serving.app import create_app
    from hooks.settings import Settings

ROUTES = tuple(hook.path for hook in HOOKS)
ADMISSION_ROUTES = tuple(hook.path for hook in HOOKS if hook.https_only)


class FixedTenancy:
    """Tenant a bounded to 4 devices (2 of class l40s), with one app under it."""

    def classes(self) -> list[ClassIdentity]:
        return [ClassIdentity("l40s", "2026-01-01T00:00:00Z", False, "nvidia.com/GPU")]

    def tenancy(self, namespaces: Sequence[str]) -> Tenancy:
        return Tenancy((Tenant("tenant-root", "a", {TOTAL_KEY: 4, class_key("l40s"): 2}),), ())


# KubeVirt unreadable, cached for the whole run: the fuzzer explores the hooks, not the network.
APP = create_app(
    Settings(kube_api="http://127.0.0.1:9", kube_timeout_seconds=0.05, kubevirt_cache_seconds=60),
    budgets=FixedTenancy(),
)
APP.testing = True
CLIENT = APP.test_client()


def test_one_input(data: bytes) -> None:
    # The first byte picks the route and the rest is the body, so seeds stay valid JSON.
    if not data:
        return
    route = ROUTES[data[0] % len(ROUTES)]
    body = data[1:]
    base_url = "https://localhost" if route in ADMISSION_ROUTES else "http://localhost"
    response = CLIENT.post(route, data=body, content_type="application/json", base_url=base_url)
    if response.status_code != 200 and not 400 <= response.status_code < 500:
        raise RuntimeError(f"{route} answered {response.status_code}")
    json.loads(response.get_data())


def seed(corpus: Path, examples: Path) -> None:
    """Every example request behind every route's byte: the fuzzer starts from real bodies."""
    corpus.mkdir(exist_ok=True)
    for example in sorted(examples.glob("*.json")):
        for index in range(len(ROUTES)):
            (corpus / f"{index}-{example.name}").write_bytes(bytes([index]) + example.read_bytes())


def main() -> None:
    if sys.argv[1:2] == ["seed"]:
        seed(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
