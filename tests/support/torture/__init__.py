"""The torture and fault tests' machinery: a fleet, an operation mix, the invariant checks, the commit-order
log, a statement stepper, server processes and the database-restart scenario."""
