package journal

import (
	"encoding/json"
	"fmt"
)

// encode is an entry as every backend stores it.
func encode(e Entry) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("journal: encode entry: %w", err)
	}
	return b, nil
}

// decode reads what encode wrote for attemptID.
func decode(b []byte, attemptID string) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, fmt.Errorf("journal: entry for %s is unreadable: %w", attemptID, err)
	}
	return e, nil
}
