"""The HTTP tests' client: the app on weightless fakes (:mod:`tests.service.fakes`), its requests authorized."""

from __future__ import annotations

import pytest

from tests.service.fakes import BASE, KEY, fakes


@pytest.fixture
def client(fake_service):
    with fake_service(fakes(), settings=BASE, key=KEY) as c:
        yield c
