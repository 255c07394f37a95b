// Command probe is the k8s tests' container: one static binary in a scratch image that logs,
// serves HTTP, resolves names and reads and writes files, so a test can see each from outside.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe log|serve|get|poll|connect|lookup|write|cat ARGS")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "log": // print the words, then stay up
		fmt.Println(strings.Join(args, " "))
		for {
			time.Sleep(time.Hour)
		}
	case "serve": // answer every request with "probe <hostname>"
		host, _ := os.Hostname()
		http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "probe %s\n", host) })
		fail(http.ListenAndServe(":"+args[0], nil).Error())
	case "get":
		client := http.Client{Timeout: 5 * time.Second}
		resp, err := client.Get(args[0])
		if err != nil {
			fail(err.Error())
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Print(string(body))
	case "poll": // GET until answered, at most SECONDS (a firewall learns a new pod's address late)
		client := http.Client{Timeout: 2 * time.Second}
		seconds, _ := strconv.Atoi(args[1])
		deadline := time.Now().Add(time.Duration(seconds) * time.Second)
		for {
			resp, err := client.Get(args[0])
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				fmt.Print(string(body))
				return
			}
			if time.Now().After(deadline) {
				fail(err.Error())
			}
			time.Sleep(500 * time.Millisecond)
		}
	case "connect": // a TCP connection to HOST:PORT within SECONDS, tried again until then
		seconds, _ := strconv.Atoi(args[1])
		deadline := time.Now().Add(time.Duration(seconds) * time.Second)
		for {
			conn, err := net.DialTimeout("tcp", args[0], 2*time.Second)
			if err == nil {
				conn.Close()
				fmt.Println("connected")
				return
			}
			if time.Now().After(deadline) {
				fail(err.Error())
			}
			time.Sleep(500 * time.Millisecond)
		}
	case "lookup":
		addrs, err := net.LookupHost(args[0])
		if err != nil {
			fail(err.Error())
		}
		fmt.Println(strings.Join(addrs, " "))
	case "write":
		if err := os.WriteFile(args[0], []byte(args[1]), 0o644); err != nil {
			fail(err.Error())
		}
	case "cat":
		data, err := os.ReadFile(args[0])
		if err != nil {
			fail(err.Error())
		}
		fmt.Print(string(data))
	default:
		fail("unknown command " + os.Args[1])
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(1)
}
