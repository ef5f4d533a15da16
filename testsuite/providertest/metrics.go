package providertest

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Scrape GETs a Prometheus text endpoint (a durallm worker's /metrics) and
// returns the body, for tests that check counters against what happened.
func Scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", fmt.Errorf("providertest: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("providertest: scrape %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("providertest: scrape %s: %w", url, err)
	}
	return string(b), nil
}

// MetricSum adds the values of every sample of the metric name in a
// Prometheus text body whose label set contains every one of labels
// (written as they appear, e.g. `durallm_classification="refused"`).
// Absent samples sum to 0.
func MetricSum(body, name string, labels ...string) float64 {
	var sum float64
next:
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}
