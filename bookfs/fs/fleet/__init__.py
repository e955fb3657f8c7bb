"""A fleet mount (``bookfs mount --fleet DIR MNT``): every log under ``DIR`` as
``MNT/<ship>/``, read-only, served by one daemon.

``ops``     the fleet's ``Operations``: routes each request to its ship, opens ships on
            first use and closes idle ones, error files for ships that cannot be read
``ship``    one ship: a single read-only mount's operations in the fleet's inodes, and
            what a closed ship shows (its card)
``ahead``   ship readahead: the cards of the next ships, built by separate processes
            once a walk goes through the ships in order
``builders`` those processes: spawned, fed down a pipe each, read by the event loop
``builder``  what runs inside one: its set-up, its loop and its job (no ``trio``: each
            start imports it again)
``inodes``  a ship's inode numbers with its id in the bits a single log leaves unused
``daemon``  the fleet daemon's life cycle
"""
