package providertest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestScrapeAndMetricSum(t *testing.T) {
	const body = `# HELP durallm_attempts_total Attempts
durallm_attempts_total{durallm_classification="refused",durallm_route="a"} 2
durallm_attempts_total{durallm_classification="refused",durallm_route="b"} 3
durallm_attempts_total{durallm_classification="completed",durallm_route="a"} 7
durallm_attempts_total_other{durallm_classification="refused"} 100
durallm_quarantines_total 1
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(body)) }))
	defer srv.Close()
	got, err := Scrape(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"durallm_attempts_total", []string{`durallm_classification="refused"`}, 5},
		{"durallm_attempts_total", []string{`durallm_classification="refused"`, `durallm_route="a"`}, 2},
		{"durallm_attempts_total", nil, 12},
		{"durallm_quarantines_total", nil, 1},
		{"durallm_missing_total", nil, 0},
	} {
		if v := MetricSum(got, c.name, c.labels...); v != c.want {
			t.Errorf("MetricSum(%s, %v) = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if _, err := Scrape(srv.URL + "/nope\x7f"); err == nil {
		t.Error("a bad URL scraped fine")
	}
}
