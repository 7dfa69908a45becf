"""What test modules share: helpers and fixtures, one module per subject.

A test module imports helpers from here (or from the older shared modules beside this package:
`tests/helpers.py` for repositories and daemons, `tests/realcli.py`, `tests/fakemodel.py`,
`tests/fakeclock.py`, `tests/faultproxy.py`, `tests/queryplans.py`), never from another test module
or a conftest. A fixture that several modules use is defined here and imported where it is used
(or by a conftest). Waiting for state nothing reports is `eventually.eventually()`.
"""
