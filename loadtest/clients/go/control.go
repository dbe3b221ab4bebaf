package main

// The driver's commands on stdin (-control): how many devices hold a connection, and when a
// restart's reconnects start to be counted. A ramp grows the first; a restart sets the second.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

type command struct {
	Target *int     `json:"target"`
	Mark   *float64 `json:"mark"` // the driver's wall time; opens are counted from when it is read
}

func parseCommand(line []byte) (command, error) {
	var cmd command
	if err := json.Unmarshal(line, &cmd); err != nil {
		return cmd, fmt.Errorf("a command is a JSON object: %q: %w", line, err)
	}
	return cmd, nil
}

// readCommands sends each well-formed line of r; the channel closes at EOF (the driver is gone).
func readCommands(r io.Reader) <-chan command {
	out := make(chan command)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if len(sc.Bytes()) == 0 {
				continue
			}
			cmd, err := parseCommand(sc.Bytes())
			if err != nil {
				fmt.Fprintln(os.Stderr, "loadclient:", err)
				continue
			}
			out <- cmd
		}
	}()
	return out
}
