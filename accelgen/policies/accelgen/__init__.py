"""AccelGen (SPEC section 4, paper sections 4.2-4.4): the policy (``policy``), its clairvoyant
variant (``oracle``) and the one compiled decision they run (``decide`` and the modules it calls;
``docs/accelgen.md`` maps each step of the paper to its module and function)."""

from accelgen.policies.accelgen.policy import AccelGenParams, AccelGenPolicy

__all__ = ["AccelGenParams", "AccelGenPolicy"]
