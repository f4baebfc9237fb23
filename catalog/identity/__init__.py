"""Who signed what: Ed25519 keys (:mod:`.keys`), DSSE v1 envelopes (:mod:`.dsse`) and in-toto
Statements over a release directory (:mod:`.attestations`), in the standard formats so that a
verifier other than dprelease (the DSSE or in-toto reference libraries) can check them offline.

Pure: nothing here reads confidential data or talks to the catalog database.
"""
