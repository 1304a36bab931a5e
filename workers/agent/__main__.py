from workers.agent.cli import main

raise SystemExit(main())
