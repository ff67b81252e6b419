"""The lab: loopback SSH hosts with private ``/srv`` folders, for the demo and the tests."""

from transplant.lab.hosts import INSTALL_HINT, Lab, LabHost, check_requirements

__all__ = ["Lab", "LabHost", "check_requirements", "INSTALL_HINT"]
