from ggufsmith.cli import main

raise SystemExit(main())
