-- The most items each capped key ever had running, as the database recorded it (watch_caps.sql),
-- with its cap then: a peak past its cap is a breach.
SELECT kind, key, peak, cap, at::text
  FROM chaos_cap_peaks
 ORDER BY kind, key;
