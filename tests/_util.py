from conftest import assert_rel_close, rel_err  # noqa: F401
