"""`python -m attnprof` runs the same CLI as the `attnprof` command."""

from attnprof.entry import main

if __name__ == "__main__":
    main()
