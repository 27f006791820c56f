"""Our Controller, in process and behind its ZMQ service, passes ``dressage.testing.ControllerTests``."""

from __future__ import annotations

from dressage.testing import ControllerTests, serve_controller
from dressage.tq import Controller


class TestInProcessController(ControllerTests):
    def make_controller(self, units, *, strict_budget=False):
        return Controller(units, strict_budget=strict_budget)


class TestControllerService(ControllerTests):
    def make_controller(self, units, *, strict_budget=False):
        served = serve_controller(Controller(units, strict_budget=strict_budget))
        assert served.remote.remote is True  # every call below crosses the socket
        return served


class TestControllerServiceWithHmac(ControllerTests):
    def make_controller(self, units, *, strict_budget=False):
        return serve_controller(Controller(units, strict_budget=strict_budget), secret=b"controller-secret-0123")
