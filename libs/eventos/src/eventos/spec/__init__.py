"""An employee as declared (SPEC §3, §11): the `kind: Employee` model, validated with every
error named by its field path (`model`), and the content rules it declares, compiled once per
generation and run on each outgoing message (`content_rules`)."""
