"""The settings table: every setting from the environment and from a TOML file, a wrong type for each, the
precedence between them, and the configuration reference rendered from the table."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient

from embedrank.testing.fake import FakeEncoder
from service.app import create_app
from service.settings import (
    OTHER_ENVIRONMENT,
    Engine,
    Settings,
    SettingsError,
    env_name,
    fields,
    groups,
    known_environment,
)
from service.settings_reference import render_reference

pytestmark = pytest.mark.kernel_free

ROOT = Path(__file__).resolve().parents[2]


def samples(tmp_path: Path) -> dict[str, tuple[str, str, object]]:
    """A value other than the default for every setting: ``name -> (environment text, TOML text, what
    Settings holds)``, the last read through :func:`held`."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-from-file\n")
    return {
        "models": ("m1=fake:encoder,m2=fake:cross-encoder", '[{id = "m1", path = "fake:encoder"}, {id = "m2", path = "fake:cross-encoder"}]', (("m1", "fake:encoder"), ("m2", "fake:cross-encoder"))),
        "backend": ("torch", '"torch"', "torch"),
        "precision": ("fp32", '"fp32"', "fp32"),
        "trust_remote_code": ("sentence-transformers/all-MiniLM-L6-v2", '["sentence-transformers/all-MiniLM-L6-v2"]', True),
        "api_keys": ("key-1,key-2", '["key-1", "key-2"]', ("key-1", "key-2")),
        "api_keys_file": (str(keys), f'"{keys}"', ("key-from-file",)),
        "no_auth": ("true", "true", True),
        "cors_origins": ("https://a.example,http://b.example:8080", '["https://a.example", "http://b.example:8080"]', ("https://a.example", "http://b.example:8080")),
        "token_ids": ("off", '"off"', False),
        "max_inputs": ("7", "7", 7),
        "max_documents": ("8", "8", 8),
        "max_body_bytes": ("9000", "9000", 9000),
        "max_text_chars": ("10", "10", 10),
        "max_request_tokens": ("11", "11", 11),
        "max_multivector_tokens": ("12", "12", 12),
        "max_queue": ("13", "13", 13),
        "max_queue_seconds": ("1.5", "1.5", 1.5),
        "target_batch_seconds": ("0", "0", None),
        "max_batch_tokens": ("14", "14", 14),
        "max_batch_size": ("15", "15", 15),
        "batch_wait_ms": ("2.5", "2.5", 2.5),
        "idle_seconds": ("3", "3", 3.0),
        "drain_seconds": ("4", "4", 4.0),
        "body_timeout_seconds": ("5", "5", 5.0),
        "header_timeout_seconds": ("6", "6", 6.0),
        "fronts": ("3", "3", 3),
        "access_log": ("1", "true", True),
        "log_level": ("debug", '"debug"', "debug"),
        "log_format": ("json", '"json"', "json"),
        "metrics_batch_ids": ("true", "true", True),
        "public_docs": ("false", "false", False),
        "on_model_failure": ("serve-others", '"serve-others"', "serve-others"),
        "tune_malloc": ("false", "false", False),
        "batch_dir": ("/srv/batches", '"/srv/batches"', "/srv/batches"),
        "max_images": ("3", "3", 3),
        "max_image_bytes": ("2048", "2048", 2048),
        "max_image_pixels": ("640000", "640000", 640000),
        "image_url_hosts": ("img.example.com,*.cdn.example.com", '["img.example.com", "*.cdn.example.com"]', ("img.example.com", "*.cdn.example.com")),
        "image_url_private": ("true", "true", True),
        "image_fetch_seconds": ("2.5", "2.5", 2.5),
        "max_file_bytes": ("16", "16", 16),
        "max_file_storage_per_key": ("4096", "4096", 4096),
        "max_batch_lines": ("17", "17", 17),
        "max_batches_in_flight": ("18", "18", 18),
        "max_vector_stores": ("19", "19", 19),
        "max_vector_store_files": ("20", "20", 20),
        "max_vector_store_chunks": ("21", "21", 21),
        "max_file_pages": ("22", "22", 22),
        "file_read_seconds": ("12.5", "12.5", 12.5),
        "file_read_cpu_seconds": ("13", "13", 13),
        "file_read_memory": ("268435456", "268435456", 268435456),
        "max_file_reads_per_key": ("3", "3", 3),
        "max_filter_clauses": ("23", "23", 23),
        "max_searches_per_key": ("3", "3", 3),
        "max_filter_depth": ("24", "24", 24),
        "batch_lease_seconds": ("7.5", "7.5", 7.5),
        "device": ("auto", '"auto"', "auto"),
        "embedding_cache_bytes": ("0", "0", 0),
        "embedding_cache_dir": ("/var/cache/vectors", '"/var/cache/vectors"', "/var/cache/vectors"),
        "embedding_cache_direct": ("true", "true", True),
        "batch_database": ("postgresql://embedrank@db/batches", '"postgresql://embedrank@db/batches"',
                           "postgresql://embedrank@db/batches"),
    }  # fmt: skip


def held(settings: Settings, name: str) -> object:
    """What ``settings`` holds for the setting ``name``, read from its group."""
    entries = settings.models.entries
    if name == "models":
        return tuple((m.id, m.path) for m in entries)
    if name in ("backend", "precision", "device", "trust_remote_code"):
        return getattr(entries[0], name)  # the group's default, applied to the entry that names none
    if name == "api_keys_file":
        return settings.auth.api_keys
    if name == "token_ids":
        return settings.server.decodes_token_ids
    if name == "target_batch_seconds":
        return settings.engine.engine_config().target_batch_seconds
    setting = fields()[name]
    return getattr(getattr(settings, setting.group), setting.attribute)


def write_toml(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "embedrank.toml"
    path.write_text(text)
    return {"EMBEDRANK_CONFIG": str(path)}


def test_the_samples_cover_every_setting(tmp_path):
    assert set(samples(tmp_path)) == set(fields())


@pytest.mark.parametrize("name", list(fields()))
def test_every_setting_from_the_environment_and_from_the_file(tmp_path, name):
    env_text, toml_text, expected = samples(tmp_path)[name]
    default = held(Settings(), name)
    assert expected != default, name
    assert held(Settings.from_env({env_name(name): env_text}), name) == expected
    assert held(Settings.from_env(write_toml(tmp_path, f"{name} = {toml_text}\n")), name) == expected


WRONG = {  # a wrong value for every setting: (environment text, TOML text)
    "models": ("m@", '"m1"'),
    "backend": ("cuda", "1"),
    "precision": ("fp64", "32"),
    "trust_remote_code": ("no-such-model", "true"),
    "api_keys": ("two words", '"my-secret"'),
    "api_keys_file": ("/no/such/keys", '["keys.txt"]'),
    "no_auth": ("yes", '"true"'),
    "cors_origins": ("https://a.example/path", '"https://a.example"'),
    "token_ids": ("o200k_base", "false"),
    "max_inputs": ("many", '"12"'),
    "max_documents": ("1.5", "1.5"),
    "max_body_bytes": ("16MiB", '"16MiB"'),
    "max_text_chars": ("-1", "0"),
    "max_request_tokens": ("0", "-5"),
    "max_multivector_tokens": ("x", "[1]"),
    "max_queue": ("0", "true"),
    "max_queue_seconds": ("0", '"30"'),
    "target_batch_seconds": ("-1", "-0.5"),
    "max_batch_tokens": ("8k", '"8192"'),
    "max_batch_size": ("0", "0"),
    "batch_wait_ms": ("-1", '"off"'),
    "idle_seconds": ("0", "0"),
    "drain_seconds": ("-1", '"30s"'),
    "body_timeout_seconds": ("0", "0"),
    "header_timeout_seconds": ("soon", "-1"),
    "fronts": ("many", "65"),
    "access_log": ("on", "1.5"),
    "log_level": ("verbose", "10"),
    "log_format": ("yaml", "1"),
    "metrics_batch_ids": ("some", '"yes"'),
    "public_docs": ("closed", '"no"'),
    "on_model_failure": ("ignore", "1"),
    "tune_malloc": ("off", '"no"'),
    "batch_dir": ("/proc/version", "5"),
    "max_images": ("many", "0"),
    "max_image_bytes": ("10MB", "0"),
    "max_image_pixels": ("4K", "-1"),
    "image_url_hosts": ("https://img.example.com", '"img.example.com"'),
    "image_url_private": ("perhaps", '"yes"'),
    "image_fetch_seconds": ("soon", "0"),
    "max_file_bytes": ("100MB", "0"),
    "max_file_storage_per_key": ("10GB", "-1"),
    "max_batch_lines": ("0", '"50000"'),
    "max_batches_in_flight": ("-1", "1.5"),
    "max_vector_stores": ("0", "2.5"),
    "max_vector_store_files": ("-5", '"10"'),
    "max_vector_store_chunks": ("lots", "0"),
    "max_file_pages": ("many", "-1"),
    "file_read_seconds": ("0", '"60s"'),
    "file_read_cpu_seconds": ("1.5", "0"),
    "file_read_memory": ("1GB", "0"),
    "max_file_reads_per_key": ("0", '"all"'),
    "max_filter_clauses": ("0", "1.5"),
    "max_searches_per_key": ("0", '"two"'),
    "max_filter_depth": ("deep", "0"),
    "batch_lease_seconds": ("0", '"60s"'),
    "device": ("gpu", '"cuda:x"'),
    "embedding_cache_bytes": ("1GB", "-1"),
    "embedding_cache_dir": ("/proc/version", "1"),
    "embedding_cache_direct": ("sometimes", '"yes"'),
    "batch_database": ("mysql://db/batches", '"/srv/batches.db"'),
}


@pytest.mark.parametrize("name", list(fields()))
def test_a_wrong_value_for_every_setting_stops_the_start_naming_it(tmp_path, name):
    assert set(WRONG) == set(fields())
    wrong_env, wrong_toml = WRONG[name]
    with pytest.raises(SettingsError) as err:
        Settings.from_env({env_name(name): wrong_env})
    message = str(err.value)
    assert env_name(name) in message, message
    with pytest.raises(SettingsError) as err:
        Settings.from_env(write_toml(tmp_path, f"{name} = {wrong_toml}\n"))
    message = str(err.value)
    assert f"`{name}" in message, message


def test_a_string_api_key_in_toml_is_refused_never_read_as_characters(tmp_path):
    """The defect: ``api_keys = "my-secret"`` made every character a key (``Bearer m`` passed)."""
    with pytest.raises(
        SettingsError,
        match=r'`api_keys` in .*expected a list, got text; write a TOML array: api_keys = \["my-secret"\]',
    ):
        Settings.from_env(write_toml(tmp_path, 'api_keys = "my-secret"\n'))
    with pytest.raises(SettingsError, match=r"`cors_origins` in .*a list"):
        Settings.from_env(write_toml(tmp_path, 'cors_origins = "https://a.example"\n'))
    settings = Settings.from_env(write_toml(tmp_path, 'api_keys = ["my-secret"]\n'))
    assert settings.auth.api_keys == ("my-secret",)
    app = create_app(
        Settings(auth=settings.auth, engine=Engine(batch_wait_ms=0, tune_malloc=False)),
        wait_for_models=True,
        models={"m": FakeEncoder()},
    )
    with TestClient(app) as client:
        assert client.get("/v1/models", headers={"Authorization": "Bearer my-secret"}).status_code == 200
        for char in ("m", "y", "-"):
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {char}"}).status_code == 401


def test_the_environment_wins_over_the_file_and_models_replace_every_table(tmp_path):
    env = write_toml(
        tmp_path,
        'max_inputs = 5\napi_keys = ["from-file"]\n[[models]]\nid = "file-model"\npath = "fake:encoder"\n',
    )
    from_file = Settings.from_env(env)
    assert (from_file.limits.max_inputs, from_file.auth.api_keys, from_file.models.entries[0].id) == (
        5,
        ("from-file",),
        "file-model",
    )
    both = Settings.from_env(
        {**env, "EMBEDRANK_MAX_INPUTS": "9", "EMBEDRANK_API_KEYS": "from-env", "EMBEDRANK_MODELS": "env=fake:encoder"}
    )
    assert (both.limits.max_inputs, both.auth.api_keys, [m.id for m in both.models.entries]) == (
        9,
        ("from-env",),
        ["env"],
    )
    empty = Settings.from_env({**env, "EMBEDRANK_MAX_INPUTS": "", "EMBEDRANK_API_KEYS": ""})  # empty: unset
    assert (empty.limits.max_inputs, empty.auth.api_keys) == (5, ("from-file",))


@pytest.mark.parametrize(
    ("env", "toml", "message"),
    [
        ({"EMBEDRANK_API_KEYS": " , "}, None, r"EMBEDRANK_API_KEYS is set but holds no key"),
        ({}, "api_keys = []", r"`api_keys` in .* is set but holds no key"),
        ({}, 'api_keys = ["  "]', r"visible ASCII"),
        ({"EMBEDRANK_API_KEYS": "two words"}, None, r"EMBEDRANK_API_KEYS: an API key must be visible ASCII"),
        ({"EMBEDRANK_API_KEYS": "clé"}, None, r"visible ASCII"),
        ({"EMBEDRANK_API_KEY": "secret"}, None, r"EMBEDRANK_API_KEY \(did you mean EMBEDRANK_API_KEYS\?\)"),
        ({}, "max_input = 7", r"unknown key `max_input` \(did you mean `max_inputs`\?\) in the file"),
        ({}, "[limits]\nmax_inputs = 7", r"`limits` is a group of the configuration reference, not a table"),
        ({}, '[[models]]\nid = "m"\npaht = "x"', r"unknown key `paht` \(did you mean `path`\?\) in the \[\[models\]\]"),
        ({}, '[[models]]\npath = "x"', r"`models\[0\]` .* missing required field `id`"),
        ({"EMBEDRANK_MODELS": "a=fake:encoder,a=fake:encoder"}, None, r"the id 'a' is given to more than one model"),
        ({"EMBEDRANK_MAX_INPUTS": "0"}, None, r"EMBEDRANK_MAX_INPUTS \(given '0'\): expected an integer >= 1"),
        ({"EMBEDRANK_NO_AUTH": "yes"}, None, r"EMBEDRANK_NO_AUTH \(given 'yes'\): expected true or false"),
        ({"EMBEDRANK_TOKEN_IDS": "o200k"}, None, r"EMBEDRANK_TOKEN_IDS .* must be one of `cl100k_base`, `off`"),
        ({"EMBEDRANK_CONFIG": "/no/such/file.toml"}, None, r"EMBEDRANK_CONFIG=/no/such/file.toml: .*No such file"),
        ({}, "max_inputs = ", r"EMBEDRANK_CONFIG=.*: Invalid value"),
    ],
)
def test_settings_that_stop_the_start(tmp_path, env, toml, message):
    if toml is not None:
        env = {**env, **write_toml(tmp_path, toml + "\n")}
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_the_model_table_keys_and_trust_remote_code(tmp_path):
    env = write_toml(
        tmp_path,
        'backend = "onnx"\n[[models]]\nid = "a"\npath = "fake:encoder"\naliases = ["alias"]\ntrust_remote_code = true\n'
        '[[models]]\nid = "b"\npath = "fake:encoder"\nbackend = "torch"\n',
    )
    a, b = Settings.from_env({**env, "EMBEDRANK_TRUST_REMOTE_CODE": "b"}).models.entries
    assert (a.aliases, a.trust_remote_code, a.backend) == (("alias",), True, "onnx")
    assert (b.trust_remote_code, b.backend) == (True, "torch")


def test_the_configuration_reference_is_the_table_rendered():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render_reference(), "run: python -m service.settings_reference > docs/configuration.md"
    for name in fields():
        assert f"| `{name}` | `{env_name(name)}` |" in page


def test_every_embedrank_variable_in_the_code_is_in_the_reference():
    page = (ROOT / "docs" / "configuration.md").read_text()
    named = set()
    for folder in ("embedrank", "service", "eval", "notebooks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_settings.py":  # it spells unknown names on purpose
                continue
            named |= set(re.findall(r"\bEMBEDRANK_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    named |= set(re.findall(r"\bEMBEDRANK_[A-Z][A-Z0-9_]*[A-Z0-9]\b", (ROOT / "app.py").read_text()))
    assert named, "the scan found no variable"
    assert named <= known_environment(), sorted(named - known_environment())
    testing = (ROOT / "docs" / "guides" / "testing.md").read_text()  # the project's own scripts' variables
    for name in known_environment():
        assert f"`{name}`" in (testing if name in OTHER_ENVIRONMENT["development"] else page), name


def test_the_reference_example_is_a_valid_configuration(tmp_path):
    example = re.search(r"```toml\n(.*?)```", render_reference(), re.S)
    assert example is not None
    keys = tmp_path / "keys"
    keys.write_text("k\n")
    settings = Settings.from_env(write_toml(tmp_path, example[1].replace("/run/secrets/embedrank-keys", str(keys))))
    assert [m.id for m in settings.models.entries] == ["sentence-transformers/all-MiniLM-L6-v2", "minilm-int8"]
    assert msgspec.convert({}, Settings) == Settings()


def test_every_toml_example_in_the_manual_is_a_valid_configuration(tmp_path):
    blocks = [
        (page, block)
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for block in re.findall(r"^```toml\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    ]
    assert len(blocks) >= 2
    keys = tmp_path / "keys"
    keys.write_text("k\n")
    for page, block in blocks:
        text = block.replace("/run/secrets/embedrank-keys", str(keys))
        assert Settings.from_env(write_toml(tmp_path, text)).models.entries, page


def test_the_service_guide_shows_the_real_message_for_a_string_key(tmp_path, monkeypatch):
    guide = (ROOT / "docs" / "guides" / "service.md").read_text()
    shown = re.search(r"^```text\n(`api_keys` in .*?)\n```", guide, flags=re.M)
    assert shown is not None
    monkeypatch.chdir(tmp_path)
    Path("embedrank.toml").write_text('api_keys = "my-secret"\n')
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"EMBEDRANK_CONFIG": "embedrank.toml"})
    assert str(err.value) == shown[1]


def test_each_group_is_read_by_what_it_concerns_and_every_setting_has_one_group():
    """The table is grouped by concern; each setting sits in exactly one group, under its own name (the bound
    models' list excepted: ``models.entries``), and the reference shows each group's table."""
    placed = [(setting.group, setting.attribute) for setting in fields().values()]
    assert len(set(placed)) == len(placed) == len(fields())
    assert {group for group, _ in placed} == set(groups()) == {
        "models", "auth", "server", "limits", "images", "engine", "batches", "cache", "telemetry"
    }  # fmt: skip
    assert [name for name, s in fields().items() if name != s.attribute] == ["models"]
    page = (ROOT / "docs" / "configuration.md").read_text()
    for group in groups():
        assert f"### {group.capitalize()}" in page
    settings = Settings.from_env({"EMBEDRANK_MAX_QUEUE": "5", "EMBEDRANK_BATCH_WAIT_MS": "2"})
    assert (settings.engine.engine_config().max_queue_items, settings.engine.engine_config().max_wait_ms) == (5, 2.0)
