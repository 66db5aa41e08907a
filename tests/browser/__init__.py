"""The browser test (JupyterLab + Playwright + Chromium): a package, so that pytest imports its conftest.py as
`browser.conftest` and the test modules beside tests/conftest.py keep importing that one as `conftest`."""
