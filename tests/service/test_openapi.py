"""The server documents itself: /openapi.json names a model for every JSON body and answer, the
binary uploads as application/octet-stream, and the 4xx refusals with their {"error": ...} body."""
import warnings

import pytest

from dpcdf.service.server import create_app

with warnings.catch_warnings():  # starlette's TestClient prefers httpx2; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

REF = "#/components/schemas/"
BINARY = {("post", "/tasks/{task_id}/reports"), ("post", "/tasks/{task_id}/reports/batch")}
PEERS = {("post", "/tasks/{task_id}/sync"), ("post", "/tasks/{task_id}/verify")}  # between the servers: binary both ways
ANALYST = {("get", "/tasks/{task_id}"), ("post", "/tasks/{task_id}/close"), ("post", "/tasks/{task_id}/query")}
OPERATOR_ONLY = {("get", "/metrics"), ("get", "/admin/tasks"), ("post", "/admin/retention"),  # issue 24
                 ("post", "/admin/tasks/{task_id}/close"), ("delete", "/admin/tasks/{task_id}")}


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    app = create_app(0, tmp_path_factory.mktemp("openapi"), warm_up=False)
    with TestClient(app) as client:
        res = client.get("/openapi.json")
    assert res.status_code == 200
    return res.json()


def operations(schema):
    return {(method, path): op for path, item in schema["paths"].items() for method, op in item.items()}


def refs(node) -> list[str]:
    """The component names a JSON schema refers to, directly or through a union."""
    if "$ref" in node:
        return [node["$ref"]]
    return [r for part in node.get("oneOf", []) + node.get("anyOf", []) for r in refs(part)]


def test_every_route_is_there(schema):
    assert set(operations(schema)) == {("get", "/health"), ("get", "/health/operator"), ("get", "/hpke"),
                                       ("post", "/tasks")} | PEERS | BINARY | ANALYST | OPERATOR_ONLY


def test_every_answer_and_json_body_has_a_model(schema):
    models = schema["components"]["schemas"]
    for key, op in operations(schema).items():
        ok = [code for code in op["responses"] if code.startswith("2")]
        assert len(ok) == 1, key
        if key in PEERS:
            assert set(op["responses"][ok[0]]["content"]) == {"application/octet-stream"}
            continue
        if key == ("get", "/metrics"):  # the Prometheus text format
            assert set(op["responses"][ok[0]]["content"]) == {"text/plain; version=0.0.4; charset=utf-8"}
            continue
        answer = refs(op["responses"][ok[0]]["content"]["application/json"]["schema"])
        assert answer and all(r.startswith(REF) and r[len(REF):] in models for r in answer), key
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None:
            named = refs(body["schema"])
            assert named and all(r[len(REF):] in models for r in named), key
    assert models["PrefixQuery"]["properties"]["indices"]["items"]["type"] == "integer"
    query = operations(schema)[("post", "/tasks/{task_id}/query")]["requestBody"]["content"]["application/json"]
    assert {r[len(REF):] for r in refs(query["schema"])} == {"PrefixQuery", "NodesQuery", "GroupsQuery", "CoordinatesQuery", "BinsQuery"}
    assert "TaskSpec" in refs(operations(schema)[("post", "/tasks")]["requestBody"]["content"]["application/json"]["schema"])[0]


def test_uploads_are_documented_as_binary(schema):
    for key in BINARY | PEERS:
        content = operations(schema)[key]["requestBody"]["content"]
        assert set(content) == {"application/octet-stream"}, key
        assert content["application/octet-stream"]["schema"] == {**content["application/octet-stream"]["schema"],
                                                                   "type": "string", "format": "binary"}


def test_refusals_are_documented_with_the_error_model(schema):
    for key, op in operations(schema).items():
        refused = {code for code in op["responses"] if code.startswith("4")}
        assert "422" not in refused, key  # invalid requests are answered 400, not FastAPI's 422
        for code in refused:
            assert op["responses"][code]["content"]["application/json"]["schema"] == {"$ref": REF + "Error"}
        if key in ANALYST:
            assert "401" in refused and op["security"] == [{"HTTPBearer": []}], key
        elif key[1] == "/health/operator" or key in OPERATOR_ONLY:  # no input but the operator's token
            assert {"401", "403"} <= refused and op["security"] == [{"OperatorBearer": []}], key
        elif key[1] != "/health" and key[1] != "/hpke":
            assert "400" in refused, key
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
