// Command kubeletclient plays the kubelet's side of the DRA gRPC service for the
// benchmarks: NodePrepareResources and NodeUnprepareResources on a plugin's socket, made
// with the stubs of the upstream k8s.io/kubelet module and grpc-go, as the kubelet makes
// them. It reads one JSON request on stdin and prints each call's latency as JSON.
//
// Input:  {"socket": "/path/dra.sock", "mode": "single"|"burst"|"empty",
//
//	"claims": [{"uid": "...", "namespace": "...", "name": "..."}],
//	"warmup": 5, "rounds": 200, "concurrency": 16}
//
// single: the first claim prepared then unprepared, warmup+rounds times, one call at a
// time; burst: every claim prepared, concurrency calls in flight, one claim per call,
// then every claim unprepared the same way; empty: NodeUnprepareResources with no claims
// (the gRPC round trip alone), warmup+rounds times.
//
// Output: {"prepare": [seconds...], "unprepare": [seconds...], "prepareWall": s,
// "unprepareWall": s}. A failed call, or a claim answered with an error, ends the
// command with status 1 and a message naming the call and the claim.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// The kubelet's deadline for one NodePrepareResources or NodeUnprepareResources call.
const callTimeout = 45 * time.Second

type claim struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type request struct {
	Socket      string  `json:"socket"`
	Mode        string  `json:"mode"`
	Claims      []claim `json:"claims"`
	Warmup      int     `json:"warmup"`
	Rounds      int     `json:"rounds"`
	Concurrency int     `json:"concurrency"`
}

type result struct {
	Prepare       []float64 `json:"prepare"`
	Unprepare     []float64 `json:"unprepare"`
	PrepareWall   float64   `json:"prepareWall"`
	UnprepareWall float64   `json:"unprepareWall"`
}

func main() {
	var in request
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fail("reading the request from stdin: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+in.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("connecting to %s: %v", in.Socket, err)
	}
	defer conn.Close()
	c := drapb.NewDRAPluginClient(conn)
	var out result
	switch in.Mode {
	case "single":
		if len(in.Claims) == 0 {
			fail("mode single needs one claim")
		}
		for i := 0; i < in.Warmup+in.Rounds; i++ {
			p := prepare(c, in.Claims[0])
			u := unprepare(c, in.Claims[0])
			if i >= in.Warmup {
				out.Prepare = append(out.Prepare, p)
				out.Unprepare = append(out.Unprepare, u)
			}
		}
	case "burst":
		if in.Concurrency < 1 {
			fail("mode burst needs a concurrency of at least 1")
		}
		out.Prepare, out.PrepareWall = inParallel(in.Claims, in.Concurrency, func(cl claim) float64 { return prepare(c, cl) })
		out.Unprepare, out.UnprepareWall = inParallel(in.Claims, in.Concurrency, func(cl claim) float64 { return unprepare(c, cl) })
	case "empty":
		for i := 0; i < in.Warmup+in.Rounds; i++ {
			u := timed("NodeUnprepareResources with no claims", func(ctx context.Context) (string, error) {
				_, err := c.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{})
				return "", err
			})
			if i >= in.Warmup {
				out.Unprepare = append(out.Unprepare, u)
			}
		}
	default:
		fail("unknown mode %q (single, burst or empty)", in.Mode)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("writing the result: %v", err)
	}
}

// inParallel calls call once per claim with concurrency calls in flight, and returns each
// call's latency (in the claims' order) and the wall time of them all.
func inParallel(claims []claim, concurrency int, call func(claim) float64) ([]float64, float64) {
	latencies := make([]float64, len(claims))
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				latencies[i] = call(claims[i])
			}
		}()
	}
	for i := range claims {
		next <- i
	}
	close(next)
	wg.Wait()
	return latencies, time.Since(start).Seconds()
}

func refs(cl claim) []*drapb.Claim {
	return []*drapb.Claim{{Namespace: cl.Namespace, Uid: cl.UID, Name: cl.Name}}
}

func prepare(c drapb.DRAPluginClient, cl claim) float64 {
	return timed("NodePrepareResources "+cl.Namespace+"/"+cl.Name, func(ctx context.Context) (string, error) {
		resp, err := c.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: refs(cl)})
		return claimError(resp.GetClaims(), cl.UID), err
	})
}

func unprepare(c drapb.DRAPluginClient, cl claim) float64 {
	return timed("NodeUnprepareResources "+cl.Namespace+"/"+cl.Name, func(ctx context.Context) (string, error) {
		resp, err := c.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: refs(cl)})
		return claimError(resp.GetClaims(), cl.UID), err
	})
}

// claimError is the error a plugin answered for the claim uid ("" when it succeeded).
func claimError[A interface{ GetError() string }](answers map[string]A, uid string) string {
	answer, ok := answers[uid]
	if !ok {
		return "no answer for the claim"
	}
	return answer.GetError()
}

// timed makes one call under the kubelet's deadline and returns its latency in seconds;
// a failed call, or an error in the claim's answer, ends the command.
func timed(what string, call func(context.Context) (string, error)) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	start := time.Now()
	claimErr, err := call(ctx)
	elapsed := time.Since(start).Seconds()
	if err != nil {
		fail("%s: %v", what, err)
	}
	if claimErr != "" {
		fail("%s: the claim's answer is an error: %s", what, claimErr)
	}
	return elapsed
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kubeletclient: "+format+"\n", args...)
	os.Exit(1)
}
