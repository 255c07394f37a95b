"""Fleet operations (SPEC §14, RFC-0005 §21): what keeps an instance alive across releases —
backups and their restore, the upgrade of the weekly window with its replay gate and rollback,
and the flags that change a generation."""
