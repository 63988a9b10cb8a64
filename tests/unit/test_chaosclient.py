"""The live-cluster client path: the real kubernetes client against a local stand-in API server."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from injectors import FAULTS, HostUnsupported
from injectors.chaosmesh.client import ChaosApiError, ChaosClient, NotInjected, injection_problems
from injectors.chaosmesh.crds import CrdUnavailable
from injectors.chaosmesh.manifests import ClusterTarget, ManifestInvalid, manifests
from injectors.process import KillConfig
from tests.crds import CRDS, needs_schema
from tests.k8s_standin import CRD_PREFIX, PREFIX, StandIn, connected
from tests.unit.test_chaosmesh import EXAMPLES, MAPPABLE

kubernetes = pytest.importorskip("kubernetes", reason="needs the kubernetes client (pip install 'baft-harness[k8s]')")

# Every test validates objects (the client does before sending), so each needs jsonschema and the CRDs.
pytestmark = [pytest.mark.k8s, needs_schema, pytest.mark.timeout(30)]

TARGET = ClusterTarget(namespace="train", selector={"training.kubeflow.org/job-name": "gpt"})
POLL = 0.005


def kill_object() -> dict[str, Any]:
    [obj] = manifests("kill", KillConfig(rank=1, at_step=3), 0, TARGET, "run-1")
    return obj


#: The first request of a client: its kind's CRD, which the object is validated against (once per client).
CRD = ("GET", f"{CRD_PREFIX}podchaos.chaos-mesh.org")


def path(obj: dict[str, Any], name: bool = True) -> str:
    base = f"{PREFIX}{obj['metadata']['namespace']}/podchaos"
    return f"{base}/{obj['metadata']['name']}" if name else base


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


@pytest.fixture
def client(standin: StandIn) -> Iterator[ChaosClient]:
    with connected(standin) as chaos:
        yield chaos


class Journal:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        self.events.append((event, payload))

    def names(self) -> list[str]:
        return [e for e, _ in self.events]


def test_apply_wait_delete_round_trip(standin: StandIn, client: ChaosClient) -> None:
    standin.inject_after_gets = 2
    obj = kill_object()
    stored = client.apply(obj)
    assert stored["metadata"]["uid"] and stored["spec"] == obj["spec"]
    done = client.wait_injected(obj, timeout=2, poll=POLL)
    assert done["status"]["experiment"]["containerRecords"][0]["phase"] == "Injected"
    assert client.delete(obj) is True
    assert standin.requests == [CRD, ("POST", path(obj, name=False))] + [("GET", path(obj))] * 3 + \
        [("DELETE", path(obj))]
    assert standin.objects == {}
    assert standin.created == [obj]


def test_injected_journals_created_injected_deleted_in_order(standin: StandIn, client: ChaosClient) -> None:
    standin.inject_after_gets, standin.pods = 1, 2
    journal = Journal()
    obj = kill_object()
    with client.injected(obj, timeout=2, journal=journal, poll=POLL, expected_pods=2) as stored:
        assert [s["metadata"]["name"] for s in stored] == [obj["metadata"]["name"]]
        assert list(standin.objects) == [("train", "podchaos", obj["metadata"]["name"])]
        assert journal.names() == ["chaos_created", "chaos_injected"]
    assert journal.names() == ["chaos_created", "chaos_injected", "chaos_deleted"]
    ident = {"name": obj["metadata"]["name"], "kind": "PodChaos", "namespace": "train"}
    for _, payload in journal.events:
        assert ident.items() <= payload.items()
    assert journal.events[1][1]["records"] == ["train/pod-0/pytorch", "train/pod-1/pytorch"]
    assert journal.events[2][1]["existed"] is True
    assert standin.objects == {}


def test_several_objects_each_journaled_and_all_deleted(standin: StandIn, client: ChaosClient) -> None:
    objs = [manifests("kill", KillConfig(rank=r, at_step=3), r, TARGET, "run-1")[0] for r in (0, 1)]
    journal = Journal()
    with client.injected(objs, timeout=2, journal=journal, poll=POLL):
        assert len(standin.objects) == 2
    assert journal.names() == ["chaos_created"] * 2 + ["chaos_injected"] * 2 + ["chaos_deleted"] * 2
    assert {p["name"] for e, p in journal.events if e == "chaos_deleted"} == {o["metadata"]["name"] for o in objs}
    assert standin.objects == {}


def test_never_injected_times_out_naming_each_record(standin: StandIn, client: ChaosClient) -> None:
    standin.never_inject, standin.pods = True, 2
    journal = Journal()
    with pytest.raises(NotInjected) as info:
        with client.injected(kill_object(), timeout=0.05, journal=journal, poll=POLL):
            pytest.fail("the body must not run when the fault never injected")
    message = str(info.value)
    assert "AllInjected=False" in message
    assert "record train/pod-0/pytorch: phase 'Not Injected'" in message
    assert "record train/pod-1/pytorch: phase 'Not Injected'" in message
    assert journal.names() == ["chaos_created", "chaos_deleted"]  # rolled back although never injected
    assert standin.objects == {}


def test_one_record_stuck_not_injected_fails_even_if_all_injected_says_true(standin: StandIn,
                                                                           client: ChaosClient) -> None:
    standin.fail_record, standin.pods = True, 3
    obj = kill_object()
    client.apply(obj)
    with pytest.raises(NotInjected) as info:
        client.wait_injected(obj, timeout=0.05, poll=POLL)
    assert info.value.problems == ["record train/pod-2/pytorch: phase 'Not Injected', expected 'Injected'"]


def test_fewer_records_than_expected_pods_fails(standin: StandIn, client: ChaosClient) -> None:
    obj = kill_object()
    client.apply(obj)
    with pytest.raises(NotInjected, match="1 container record, expected at least 2"):
        client.wait_injected(obj, timeout=0.03, poll=POLL, expected_pods=2)
    assert client.wait_injected(obj, timeout=0.03, poll=POLL, expected_pods=1)["status"]


@pytest.mark.parametrize("error", [RuntimeError("training crashed"), KeyboardInterrupt()])
def test_delete_runs_when_the_body_raises(standin: StandIn, client: ChaosClient, error: BaseException) -> None:
    journal = Journal()
    obj = kill_object()
    with pytest.raises(type(error)):
        with client.injected(obj, timeout=2, journal=journal, poll=POLL):
            raise error
    assert standin.requests[-1] == ("DELETE", path(obj))
    assert journal.names() == ["chaos_created", "chaos_injected", "chaos_deleted"]
    assert standin.objects == {}


def test_delete_of_an_absent_object_is_fine(standin: StandIn, client: ChaosClient) -> None:
    obj = kill_object()
    assert client.delete(obj) is False
    journal = Journal()
    with client.injected(obj, timeout=2, journal=journal, poll=POLL):
        del standin.objects[("train", "podchaos", obj["metadata"]["name"])]  # someone else removed it
    assert journal.events[-1][0] == "chaos_deleted" and journal.events[-1][1]["existed"] is False
    assert standin.requests.count(("DELETE", path(obj))) == 2


def test_invalid_object_is_refused_before_any_request(standin: StandIn, client: ChaosClient) -> None:
    bad = kill_object()
    bad["spec"]["mode"] = "sometimes"
    with pytest.raises(ManifestInvalid, match=r"\$\.spec\.mode"):
        with client.injected([kill_object(), bad], timeout=1, poll=POLL):
            pass
    assert standin.requests == [CRD]  # only the schema it was refused by was read


def test_server_refusal_names_the_object_and_the_reason(standin: StandIn, client: ChaosClient) -> None:
    obj = kill_object()
    client.apply(obj)
    with pytest.raises(ChaosApiError) as info:
        client.apply(obj)
    assert info.value.status == 409
    assert "already exists" in str(info.value) and obj["metadata"]["name"] in str(info.value)


def test_unreachable_server_is_an_api_error_and_nothing_is_left_to_delete() -> None:
    with StandIn() as server:
        host = server.host  # a port that is closed once the server stops
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=host))
    journal = Journal()
    with pytest.raises(ChaosApiError, match="no answer from the API server") as info:
        with ChaosClient(api_client=api, request_timeout=2, crds=CRDS).injected(kill_object(), timeout=1,
                                                                                 journal=journal):
            pass
    assert info.value.status == 0 and journal.events == []
    with pytest.raises(CrdUnavailable, match="reading CustomResourceDefinition podchaos.chaos-mesh.org failed: no "
                                             "answer from the API server"):  # the cluster's CRDs: the first request
        ChaosClient(api_client=api, request_timeout=2).apply(kill_object())
    api.close()


@pytest.mark.parametrize("kind", MAPPABLE)
def test_every_fault_kind_goes_to_its_plural(standin: StandIn, client: ChaosClient, kind: str) -> None:
    fields, chaos_kind, _ = EXAMPLES[kind]
    [obj] = manifests(kind, FAULTS[kind][0](**fields), 7, TARGET, "run-1")
    with client.injected(obj, timeout=2, poll=POLL):
        pass
    plural = {"PodChaos": "podchaos", "NetworkChaos": "networkchaos", "StressChaos": "stresschaos",
              "IOChaos": "iochaos", "TimeChaos": "timechaos"}[chaos_kind]
    assert [m for m, _ in standin.requests] == ["GET", "POST", "GET", "DELETE"]
    assert standin.requests[0][1] == f"{CRD_PREFIX}{plural}.chaos-mesh.org"
    assert standin.requests[1][1] == f"{PREFIX}train/{plural}"


def test_client_from_a_kubeconfig_file(standin: StandIn, tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: standin, cluster: {{server: "{standin.host}"}}}}]
users: [{{name: tester, user: {{token: t0ken}}}}]
contexts: [{{name: test, context: {{cluster: standin, user: tester, namespace: train}}}}]
current-context: test
""")
    client = ChaosClient(str(config), request_timeout=5)
    obj = kill_object()
    with client.injected(obj, timeout=2, poll=POLL):
        assert standin.objects
    assert standin.objects == {} and standin.requests[0] == CRD and len(standin.requests) == 4


def test_missing_kubernetes_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes now raises ImportError
    with pytest.raises(HostUnsupported, match=r"pip install 'baft-harness\[k8s\]'"):
        ChaosClient()


def test_injection_problems_reads_chaos_mesh_status() -> None:
    assert injection_problems(None) == ["condition AllInjected is not True (conditions: none)",
                                        "0 container records, expected at least 1"]
    ok = {"conditions": [{"type": "AllInjected", "status": "True"}],
          "experiment": {"containerRecords": [{"id": "a", "phase": "Injected"}]}}
    assert injection_problems(ok) == []
    assert injection_problems(ok, expected_pods=2) == ["1 container record, expected at least 2"]
