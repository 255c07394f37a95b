"""The k8s suite's helper modules get pytest's assertion rewriting (their asserts say what
differed): they are imported by the test modules before `pytest_plugins` would load them."""

import pytest

pytest.register_assert_rewrite("k8s_cluster", "k8s_release", "k8s_backlog")
