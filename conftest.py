"""Root conftest: pytester drives the plugin tests in tests/harness."""

pytest_plugins = ["pytester"]
