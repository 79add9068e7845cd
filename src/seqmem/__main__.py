from seqmem.cli import main

raise SystemExit(main())
