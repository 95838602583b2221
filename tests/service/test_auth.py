"""Who may call the service: keys from settings, environment and files, the routes only health leaves open, the
API description's pages, CORS."""

from __future__ import annotations

import re

import msgspec
import pytest
from litestar.testing import TestClient

from service.routes import DOC_PATHS
from service.settings import Auth, Settings, SettingsError
from tests.service.fakes import AUTH, BASE, KEY, MODEL, assert_error, make_app

pytestmark = pytest.mark.kernel_free


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer ", "Basic abc", "Token test-key-123", "Bearer wrong", "Bearer test-key-1234"]
)
def test_auth_failures(header):
    headers = {"Authorization": header} if header is not None else {}
    with TestClient(make_app()) as anon:
        for method, path in (
            ("post", "/v1/embeddings"),
            ("post", "/v1/rerank"),
            ("get", "/v1/models"),
            ("get", "/metrics"),
        ):
            resp = getattr(anon, method)(path, headers=headers, **({"json": {}} if method == "post" else {}))
            assert_error(resp, 401, "invalid_api_key")
            assert resp.headers["www-authenticate"] == "Bearer"
            assert KEY not in resp.text
        assert anon.get("/health", headers=headers).status_code == 200
        # /metrics counts refused requests as what they got: 401, never 500
        text = anon.get("/metrics", headers=AUTH).text
        assert 'route="/v1/models",status="401"' in text
        assert 'status="500"' not in text


def test_keys_from_env_and_file(tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# comment\nfile-key\n")
    settings = Settings.from_env(
        {"EMBEDRANK_API_KEYS": "k-a, k-b", "EMBEDRANK_API_KEYS_FILE": str(keys_file), "EMBEDRANK_MAX_INPUTS": "7"}
    )
    assert settings.auth.api_keys == ("k-a", "k-b", "file-key") and settings.limits.max_inputs == 7
    with TestClient(make_app(settings)) as c:
        for key in ("k-a", "k-b", "file-key"):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer k-c"}).status_code == 401


def test_generated_key_when_none_configured(capsys):
    with TestClient(make_app(msgspec.structs.replace(BASE, auth=Auth()))) as c:
        key = re.search(r"Authorization: Bearer (\S+)", capsys.readouterr().err).group(1)
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_explicit_no_auth_warns(capsys):
    with TestClient(make_app(msgspec.structs.replace(BASE, auth=Auth(no_auth=True)))) as c:
        assert "WITHOUT authentication" in capsys.readouterr().err
        assert c.get("/v1/models").status_code == 200


def _route_table(app):
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        for method in sorted(getattr(route, "methods", ())):
            yield method, path


def test_every_route_but_health_needs_the_key():
    app = make_app()
    table = sorted(set(_route_table(app)))
    assert ("POST", "/v1/embeddings") in table and ("GET", "/schema/openapi.json") in table
    with TestClient(app) as c:
        unknown = [("GET", "/v1/nope"), ("POST", "/admin"), ("DELETE", "/v1/embeddings"), ("GET", "/v1/rerank")]
        for method, path in [*table, *unknown]:  # OPTIONS too: CORS is off, so no preflight is open
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer  {KEY}"}):
                resp = c.request(method, path, headers=headers)
                if path == "/health":
                    assert resp.status_code in (200, 204), (method, path)
                elif path in DOC_PATHS:  # the API's description and its pages: open (public_docs)
                    assert resp.status_code != 401, (method, path)
                else:
                    assert resp.status_code == 401, (method, path, headers, resp.status_code)
        assert c.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200  # RFC 7235
        assert c.get("/v1/nope", headers=AUTH).status_code == 404  # with the key: what the path is
        assert c.delete("/v1/embeddings", headers=AUTH).status_code == 405
        assert c.options("/v1/embeddings", headers=AUTH).status_code == 204


def test_the_api_description_and_its_pages_are_open_unless_closed():
    with TestClient(make_app()) as c:
        document = c.get("/openapi.json")
        assert document.status_code == 200 and document.json() == c.get("/docs/openapi.json").json()
        assert document.json() == c.get("/schema/openapi.json").json()  # where it was before
        assert "/v1/embeddings" in document.json()["paths"] and "/openapi.json" not in document.json()["paths"]
        for page, marker in (("/docs", "swagger-ui"), ("/docs/redoc", "redoc")):
            shown = c.get(page)
            assert shown.status_code == 200 and marker in shown.text.lower() and '"/v1/embeddings"' in shown.text
    closed = Settings.from_env({"EMBEDRANK_API_KEYS": KEY, "EMBEDRANK_PUBLIC_DOCS": "false"})
    with TestClient(make_app(closed)) as c:
        for path in ("/openapi.json", "/docs", "/docs/redoc", "/docs/openapi.json"):
            assert c.get(path).status_code == 401 and c.get(path, headers=AUTH).status_code == 200, path


def test_cors_is_off_by_default_and_configurable():
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with TestClient(make_app()) as c:
        resp = c.options("/v1/embeddings", headers=preflight)
        assert "access-control-allow-origin" not in resp.headers
    settings = Settings.from_env({"EMBEDRANK_API_KEYS": KEY, "EMBEDRANK_CORS_ORIGINS": "https://app.example"})
    with TestClient(make_app(settings)) as c:
        resp = c.options(
            "/v1/embeddings", headers={**preflight, "Access-Control-Request-Headers": "authorization,content-type"}
        )
        assert resp.headers["access-control-allow-origin"] == "https://app.example"
        resp = c.post(
            "/v1/embeddings", json={"model": MODEL, "input": "x"}, headers={**AUTH, "Origin": "https://app.example"}
        )
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options("/v1/embeddings", headers={**preflight, "Origin": "https://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"
        # a browser deletes its uploaded files and reads the request id of every answer
        delete = c.options("/v1/files/file-abc", headers={**preflight, "Access-Control-Request-Method": "DELETE"})
        assert delete.status_code in (200, 204) and "DELETE" in delete.headers["access-control-allow-methods"]
        assert resp.headers["access-control-expose-headers"] == "x-request-id"


def test_a_keys_file_without_keys_or_not_utf8_stops_the_start(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("# keys go here\n\n")
    with pytest.raises(SettingsError, match=r"EMBEDRANK_API_KEYS_FILE=.*holds no key"):
        Settings.from_env({"EMBEDRANK_API_KEYS_FILE": str(empty)})
    latin = tmp_path / "latin"
    latin.write_bytes("clé\n".encode("latin-1"))
    with pytest.raises(SettingsError, match=r"EMBEDRANK_API_KEYS_FILE=.*not UTF-8"):
        Settings.from_env({"EMBEDRANK_API_KEYS_FILE": str(latin)})
