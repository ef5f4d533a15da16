//go:build !nodev

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/durallm/durallm/claimcheck"
)

// TestDevTakesALargeRequestAndItsCodecServerReadsIt runs 'dev' as it
// ships: a 3 MB request through its gateway completes (Temporal's payload
// limit is 2 MiB), the action's history holds a reference to it, and the
// codec server dev gives the UI resolves the reference to the request.
func TestDevTakesALargeRequestAndItsCodecServerReadsIt(t *testing.T) {
	dir := t.TempDir()
	d := startDev(t, "--headless", "--port", "-1", "--data-dir", filepath.Join(dir, "data"), "--metrics-addr", "", "--stream-addr", "", "--gateway-addr", "127.0.0.1:0", "--no-demo")
	addr := d.await(`server ready at (\S+)`)[1]
	codecURL := d.await(`kept by reference in \S+; the UI reads them through (http://\S+)`)[1]
	base := d.await(`OpenAI-compatible gateway at (http://\S+/v1)`)[1]
	token, err := os.ReadFile(d.await(`OPENAI_API_KEY=\$\(cat (\S+)\)`)[1])
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("a long document, page after page. ", 90_000) // 3 MB
	body, _ := json.Marshal(map[string]any{"model": "demo", "messages": []map[string]string{{"role": "user", "content": text}}})
	resp, answer := gatewayPost(t, base, string(token), "large-1", string(body))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("gateway: %d %s", resp.StatusCode, answer)
	}
	id := resp.Header.Get("X-Durallm-Action-Id")

	tc, err := client.Dial(client.Options{HostPort: addr, Logger: quietLogger(io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	iter := tc.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var input *commonpb.Payload
	for iter.HasNext() && input == nil {
		ev, err := iter.Next()
		if err != nil {
			t.Fatal(err)
		}
		if a := ev.GetWorkflowExecutionStartedEventAttributes(); a != nil {
			input = a.GetInput().GetPayloads()[0]
		}
	}
	if enc := string(input.GetMetadata()[converter.MetadataEncoding]); enc != claimcheck.EncodingReference || len(input.GetData()) > 300 {
		t.Fatalf("the action's input in history: encoding %q, %d bytes", enc, len(input.GetData()))
	}
	req, _ := protojson.Marshal(&commonpb.Payloads{Payloads: []*commonpb.Payload{input}})
	cr, err := http.Post(codecURL+"/decode", "application/json", bytes.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Body.Close()
	b, _ := io.ReadAll(cr.Body)
	var decoded commonpb.Payloads
	if cr.StatusCode != http.StatusOK || protojson.Unmarshal(b, &decoded) != nil || len(decoded.GetPayloads()) != 1 {
		t.Fatalf("codec server: %d %.200s", cr.StatusCode, b)
	}
	var in struct {
		Request struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		} `json:"request"`
	}
	if err := json.Unmarshal(decoded.GetPayloads()[0].GetData(), &in); err != nil || len(in.Request.Messages) != 1 || in.Request.Messages[0].Content != text {
		t.Fatalf("the decoded input does not hold the request: %v", err)
	}
	d.finish()
}
